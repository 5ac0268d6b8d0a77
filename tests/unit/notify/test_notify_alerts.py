"""The Alertmanager side of notify, pure: decisions as labelled alerts, when they are re-sent,
lapse and resolve (time passed in); URLs with credentials refused on the command line."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

import pytest

from faultwatch.errors import ConfigError
from faultwatch.notify.alerts import (
    MAX_LABEL_CHARS,
    RESOLVED_SENDS,
    TTL_RESENDS,
    AlertBook,
    AlertPolicy,
    labels_of,
)
from faultwatch.notify.http import HttpSecurity

POLICY = AlertPolicy(resend_s=60.0, notice_open_s=300.0, max_open_s=3600.0, max_open=3)


def dec(job: str = "j", attempt: int = 0, action: str = "restart", kind: str = "error",
        ts: float = 100.0, node: str = "n1", run_id: str = "r1") -> dict[str, Any]:
    return {"id": f"{job}/{attempt}/{action}/{kind}/{node}", "job": job, "attempt": attempt,
            "run_id": run_id, "action": action, "ts": ts,
            "targets": {"nodes": [node], "ranks": []},
            "reason": {"kind": kind, "rule": "nccl.timeout", "category": "retryable",
                       "message": "NCCL watchdog timeout"}, "evidence": {}}


def snap(job: str = "j", attempt: int = 1, steps: int = 1, ts: float = 200.0,
         phase: str = "running", run_id: str = "r1") -> dict[str, Any]:
    return {"job": job, "attempt": attempt, "steps": steps, "ts": ts, "phase": phase,
            "run_id": run_id}


def states(book: AlertBook, now: float) -> list[tuple[str, str]]:
    """(kind label, firing|resolved) of each alert posted at `now`."""
    out = []
    for a in book.due(now).alerts:
        ends = a["endsAt"]
        out.append((a["labels"]["kind"], "resolved" if ends <= _iso(now) else "firing"))
    return sorted(out)


def _iso(ts: float) -> str:
    from faultwatch.notify.alerts import rfc3339

    return rfc3339(ts)


def test_labels_route_by_action_and_are_bounded() -> None:
    assert labels_of(dec(action="fail"))["severity"] == "critical"
    assert labels_of(dec(action="fail"))["alertname"] == "FaultwatchJobFailed"
    assert labels_of(dec(action="notify"))["severity"] == "info"
    many = {**dec(), "targets": {"nodes": ["a", "b"], "ranks": []}}
    assert "node" not in labels_of(many)  # no single node: the label is left out
    long = labels_of(dec(job="x" * 500))["job"]
    assert len(long) == MAX_LABEL_CHARS


def test_an_alert_is_sent_at_once_then_every_resend_valid_for_four_resends() -> None:
    book = AlertBook(POLICY)
    book.add(dec(), now=100.0)
    first = book.due(100.0)
    assert len(first.alerts) == 1 and first.ids == {"j/0/restart/error/n1"}
    assert first.alerts[0]["endsAt"] == _iso(100.0 + TTL_RESENDS * 60.0)
    assert book.due(159.0).alerts == []  # not yet
    again = book.due(160.0)
    assert len(again.alerts) == 1 and again.ids == frozenset()  # re-sent, nothing new


def test_the_same_failure_next_attempt_is_the_same_alert_and_waits_for_a_later_one() -> None:
    book = AlertBook(POLICY)
    book.add(dec(attempt=0), now=100.0)
    book.add(dec(attempt=1, ts=150.0), now=150.0)
    assert len(book.alerts) == 1  # one fingerprint: still firing
    assert book.observe(snap(attempt=1, steps=5, ts=160.0), 160.0) == []  # its own attempt
    assert len(book.observe(snap(attempt=2, steps=1, ts=170.0), 170.0)) == 1


def test_resolution_needs_progress_a_newer_snapshot_or_the_jobs_end() -> None:
    book = AlertBook(POLICY)
    book.add(dec(kind="error"), now=100.0)
    book.add(dec(kind="hang", node="n2"), now=100.0)
    book.due(100.0)
    assert book.observe(snap(attempt=1, steps=0), 200.0) == []  # restarted, no step yet
    assert book.observe(snap(attempt=1, steps=3, ts=50.0), 200.0) == []  # older than it
    assert book.observe(snap(job="other", attempt=9, steps=9), 200.0) == []
    assert len(book.observe(snap(attempt=1, steps=3), 200.0)) == 2
    assert states(book, 200.0) == [("error", "resolved"), ("hang", "resolved")]
    for i in range(1, RESOLVED_SENDS):  # the resolution is posted RESOLVED_SENDS times
        assert len(book.due(200.0 + 60.0 * i).alerts) == 2
    assert not book.alerts  # then forgotten
    done = AlertBook(POLICY)
    done.add(dec(), now=100.0)
    assert len(done.observe(snap(attempt=0, steps=0, phase="done"), 200.0)) == 1
    rerun = AlertBook(POLICY)
    rerun.add(dec(action="fail"), now=100.0)
    assert len(rerun.observe(snap(attempt=0, steps=1, run_id="r2"), 200.0)) == 1


def test_a_snapshot_read_before_the_decision_still_resolves_it() -> None:
    book = AlertBook(POLICY)
    book.observe(snap(attempt=1, steps=2, ts=200.0), 200.0)
    book.add(dec(ts=150.0), now=201.0)
    assert states(book, 201.0) == [("error", "resolved")]


def test_notices_lapse_after_notice_open_s_and_anything_after_max_open_s() -> None:
    book = AlertBook(POLICY)
    book.add(dec(action="notify", kind="slow"), now=100.0)
    book.add(dec(action="fail"), now=100.0)
    book.due(100.0)
    assert book.next_due() == 160.0
    assert states(book, 400.0) == [("error", "firing"), ("slow", "resolved")]
    assert states(book, 3700.0) == [("error", "resolved"), ("slow", "resolved")]  # again


def test_beyond_max_open_the_oldest_alert_is_let_go() -> None:
    book = AlertBook(POLICY)
    for i, node in enumerate("abcd"):
        book.add(dec(node=node), now=100.0 + i)
    assert len(book.alerts) == POLICY.max_open and book.dropped == 1
    assert {a.labels["node"] for a in book.alerts.values()} == {"b", "c", "d"}


def _args(**kw: Any) -> argparse.Namespace:
    return argparse.Namespace(**{"alertmanager": [], "alertmanager_file": [], **kw})


def test_an_alertmanager_url_with_credentials_is_refused_on_the_command_line(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from faultwatch.cli.notify import ALERTMANAGERS_ENV, alertmanager_urls

    monkeypatch.delenv(ALERTMANAGERS_ENV, raising=False)
    with pytest.raises(ConfigError, match="password"):
        alertmanager_urls(_args(alertmanager=["https://ops:s3cret@am.example:9093"]))
    with pytest.raises(ConfigError, match="token"):
        alertmanager_urls(_args(alertmanager=["https://am.example/?token=abc"]))
    plain = ["http://am-0:9093", "http://am-1:9093"]
    secret = tmp_path / "am"
    secret.write_text("# the HA pair\nhttps://ops:s3cret@am-2:9093\n")
    monkeypatch.setenv(ALERTMANAGERS_ENV, "https://ops:s3cret@am-3:9093")
    assert alertmanager_urls(_args(alertmanager=plain, alertmanager_file=[secret])) == [
        *plain, "https://ops:s3cret@am-2:9093", "https://ops:s3cret@am-3:9093"]


def test_credentials_come_from_files(tmp_path: Path) -> None:
    basic, token = tmp_path / "basic", tmp_path / "token"
    basic.write_text("no-colon\n")
    with pytest.raises(ConfigError, match="user:password"):
        HttpSecurity(basic_auth_file=basic)
    token.write_text("t1\n")
    sec = HttpSecurity(bearer_token_file=token)
    assert sec.headers() == {"Authorization": "Bearer t1"}
    token.write_text("t2\n")  # rotated: read again for the next post
    assert sec.headers() == {"Authorization": "Bearer t2"}
    with pytest.raises(ConfigError, match="not both"):
        HttpSecurity(basic_auth_file=basic, bearer_token_file=token)
    with pytest.raises(ConfigError, match="cannot read"):
        HttpSecurity(bearer_token_file=tmp_path / "absent")
