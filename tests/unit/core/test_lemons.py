"""Lemon nodes (core/lemons.py): blamed in incidents of k distinct jobs within the window."""

from __future__ import annotations

from typing import Any

import pytest

from faultwatch.core import lemons as lemons_mod
from faultwatch.core.blast import NOTICE_JOB
from faultwatch.core.lemons import LEMON_KIND, Blame, LemonWatch, blames, lemon_decision

DAY = 86400.0


def inc(i: str, node: str = "bad", cause: str = "hang", ts: float = 100.0,
        category: str | None = None, nodes: tuple[str, ...] | None = None) -> dict[str, Any]:
    return {"id": i, "cause": cause, "category": category, "first_sign_ts": ts,
            "nodes": list(nodes if nodes is not None else (node,)), "rule": None}


def feed(w: LemonWatch, job: str, incident: dict[str, Any], now: float = 200.0,
         emit: bool = True) -> list[Any]:
    return w.observe(blames(job, "r-" + job, incident), now, emit)


def test_three_distinct_jobs_make_a_lemon_once_per_window() -> None:
    w = LemonWatch(min_jobs=3, window_s=DAY)
    assert feed(w, "a", inc("1")) == [] and feed(w, "b", inc("2")) == []
    (n,) = feed(w, "c", inc("3"))
    assert n.node == "bad" and n.jobs == ("a", "b", "c") and len(n.evidence) == 3
    assert feed(w, "d", inc("4")) == []  # noticed already, within the window
    assert w.lemons(200.0) == ["bad"]
    assert feed(w, "g", inc("7", ts=DAY + 150), now=DAY + 150) == []  # a, b, c, d too old
    assert feed(w, "h", inc("8", ts=DAY + 160), now=DAY + 160) == []
    (again,) = feed(w, "i", inc("9", ts=DAY + 250), now=DAY + 250)
    assert again.jobs == ("g", "h", "i")


def test_one_job_failing_again_and_again_is_not_a_lemon() -> None:
    w = LemonWatch(min_jobs=3, window_s=DAY)
    for k in range(10):
        assert feed(w, "same", inc(str(k))) == []
    assert feed(w, "same", inc("0")) == []  # a republished incident counts once
    assert len(w.nodes["bad"]) == 10


@pytest.mark.parametrize("incident", [
    inc("x", cause="preemption"), inc("x", cause="operator-stop"),
    inc("x", cause="divergence"), inc("x", cause="error", category="fatal"),
    inc("x", nodes=("bad", "n2", "n3")),  # blames a rack: says nothing of one node
    inc("x", nodes=())])
def test_incidents_that_say_nothing_about_the_node_do_not_count(incident: dict[str, Any]
                                                                 ) -> None:
    assert blames("j", "r", incident) == []


def test_errors_hangs_lost_nodes_and_exit_hangs_count_for_the_blamed_nodes() -> None:
    for cause in ("error", "hang", "node-lost", "exit-hang"):
        assert [b.node for b in blames("j", "r", inc("1", cause=cause, category="hardware",
                                                      nodes=("a", "b")))] == ["a", "b"]


def test_blames_older_than_the_window_do_not_count() -> None:
    w = LemonWatch(min_jobs=3, window_s=DAY)
    feed(w, "a", inc("1", ts=0.0), now=0.0)
    feed(w, "b", inc("2", ts=10.0), now=10.0)
    assert feed(w, "c", inc("3", ts=DAY + 5), now=DAY + 5) == []  # a's blame is too old
    assert feed(w, "z", inc("9", ts=1.0), now=DAY + 5) == []  # too old when it arrives


def test_catching_up_counts_without_noticing_and_notices_once_live() -> None:
    w = LemonWatch(min_jobs=3, window_s=DAY)
    for j in "abc":
        assert feed(w, j, inc(j), emit=False) == []
    assert w.lemons(200.0) == ["bad"]  # counted ...
    assert len(feed(w, "d", inc("d"))) == 1  # ... and noticed at the next live blame


def test_state_and_notices_are_bounded(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(lemons_mod, "MAX_NODES", 50)
    monkeypatch.setattr(lemons_mod, "MAX_NOTICES_PER_HOUR", 3)
    w = LemonWatch(min_jobs=2, window_s=DAY)
    got = []
    for k in range(200):
        for j in ("a", "b"):
            got += feed(w, j, inc(f"{k}{j}", node=f"n{k}"))
    assert len(w.nodes) == 50 and len(got) == 3 and w.suppressed == 197


def test_a_lemon_decision_is_a_fleet_notice_or_a_quarantine() -> None:
    w = LemonWatch(min_jobs=2, window_s=DAY)
    feed(w, "a", inc("1"))
    (n,) = feed(w, "b", inc("2"))
    d = lemon_decision(n, "notify", "rv")
    assert (d.job, d.kind, d.action, d.nodes) == (NOTICE_JOB, LEMON_KIND, "notify", ("bad",))
    assert [x["job"] for x in d.evidence["incidents"]] == ["a", "b"]
    assert "2 distinct jobs" in d.message
    q = lemon_decision(n, "quarantine")
    assert q.action == "blacklist" and q.id == d.id  # the same notice, the same id
    assert lemon_decision(n, "notify").id == d.id


def test_a_blame_dict_names_its_incident() -> None:
    b = Blame("n", "j", "r", "i1", "hang", 5.0)
    assert b.to_dict() == {"job": "j", "run_id": "r", "incident": "i1", "cause": "hang",
                           "ts": 5.0, "rule": None}


def test_a_lemon_decision_validates_against_the_published_schema() -> None:
    import json
    from pathlib import Path

    import jsonschema

    import faultwatch
    from faultwatch.wire import decision_to_dict

    schema = json.loads((Path(faultwatch.__file__).parent / "schemas"
                         / "decision.schema.json").read_text())
    w = LemonWatch(min_jobs=2, window_s=DAY)
    feed(w, "a", inc("1"))
    (n,) = feed(w, "b", inc("2"))
    for action in ("notify", "quarantine"):
        jsonschema.validate(decision_to_dict(lemon_decision(n, action)), schema)
