"""The filters of `faultwatch logs` and `faultwatch decisions`, and their times (pure)."""

from __future__ import annotations

import datetime as dt

import pytest

from faultwatch.core.events import Decision
from faultwatch.errors import UsageError
from faultwatch.readers.select import (
    DecisionFilter,
    LogFilter,
    grep_pattern,
    int_set,
    parse_when,
    str_set,
)
from faultwatch.readers.timeline import ATTEMPT, DECISION, EXIT, LINE, Row

NOW = 1_800_000_000.0


@pytest.mark.parametrize(("text", "expected"), [
    ("10m", NOW - 600), ("2h", NOW - 7200), ("1d", NOW - 86400), ("90s", NOW - 90),
    ("1.5h", NOW - 5400), ("1764165900.5", 1764165900.5),
    ("2026-11-26T14:05:00Z", dt.datetime(2026, 11, 26, 14, 5, tzinfo=dt.UTC).timestamp()),
    ("2026-11-26 14:05:00+08:00",
     dt.datetime(2026, 11, 26, 6, 5, tzinfo=dt.UTC).timestamp()),
])
def test_times_relative_iso_and_unix(text: str, expected: float) -> None:
    assert parse_when(text, NOW) == pytest.approx(expected)


def test_a_naive_iso_time_is_local() -> None:
    assert parse_when("2026-11-26T14:05:00", NOW) == dt.datetime(2026, 11, 26, 14, 5).timestamp()


@pytest.mark.parametrize("bad", ["yesterday", "10 minutes", "-5m", ""])
def test_a_bad_time_is_a_usage_error_naming_the_flag(bad: str) -> None:
    with pytest.raises(UsageError, match="--until"):
        parse_when(bad, NOW, "--until")


def line(node: str = "n1", rank: int | None = 0, attempt: int = 0, ts: float = 100.0,
         text: str = "hello", stream: str = "stdout", run_id: str = "R1") -> Row:
    return Row(LINE, ts, "j", run_id, attempt, text, node=node, rank=rank, stream=stream,
               seq=1)


def test_each_line_filter() -> None:
    assert LogFilter(nodes=frozenset({"n1"})).keeps(line())
    assert not LogFilter(nodes=frozenset({"n2"})).keeps(line())
    assert LogFilter(ranks=frozenset({0, 3})).keeps(line(rank=3))
    assert not LogFilter(ranks=frozenset({0})).keeps(line(rank=None))
    assert not LogFilter(ranks=frozenset({0})).keeps(line(rank=1))
    assert not LogFilter(attempts=frozenset({1})).keeps(line(attempt=0))
    assert LogFilter(attempts=frozenset({0, 1})).keeps(line(attempt=1))
    assert not LogFilter(run_id="R2").keeps(line())
    assert not LogFilter(streams=frozenset({"stderr"})).keeps(line())
    assert LogFilter(since=100.0, until=100.0).keeps(line(ts=100.0))  # both ends included
    assert not LogFilter(since=100.5).keeps(line(ts=100.0))
    assert not LogFilter(until=99.5).keeps(line(ts=100.0))
    assert LogFilter(grep=grep_pattern(r"NCCL.*timeout")).keeps(line(text="x NCCL op timeout"))
    assert not LogFilter(grep=grep_pattern(r"^NCCL")).keeps(line(text="x NCCL"))
    assert LogFilter().keeps(line())


def test_separators_pass_node_rank_and_grep_but_not_attempt_run_or_time() -> None:
    sep = Row(ATTEMPT, 100.0, "j", "R1", 1, "", node="n1")
    dec = Row(DECISION, 99.0, "j", "R1", 0, "m", decision={"id": "d", "action": "restart"})
    narrow = LogFilter(nodes=frozenset({"n9"}), ranks=frozenset({7}), grep=grep_pattern("x"),
                       streams=frozenset({"stderr"}))
    assert narrow.keeps(sep) and narrow.keeps(dec)
    assert not LogFilter(attempts=frozenset({0})).keeps(sep)
    assert not LogFilter(run_id="R2").keeps(dec)
    assert not LogFilter(since=99.5).keeps(dec)
    ex = Row(EXIT, 100.0, "j", "R1", 0, "exited with code 1", node="n1")
    assert not narrow.keeps(ex)  # an exit is a node's
    assert LogFilter(nodes=frozenset({"n1"}), grep=grep_pattern("zzz")).keeps(ex)


def test_bad_grep_and_numbers_are_usage_errors() -> None:
    with pytest.raises(UsageError, match="--grep"):
        grep_pattern("(unclosed")
    with pytest.raises(UsageError, match="--rank"):
        int_set(["0,x"], "--rank")
    assert int_set(["0,3", "7"], "--rank") == {0, 3, 7}
    assert str_set(["a,b", "c"]) == {"a", "b", "c"}
    assert grep_pattern(None) is None


def dec(action: str = "restart", kind: str = "error", job: str = "j", ts: float = 100.0
        ) -> Decision:
    return Decision(id=f"{job}-{action}-{kind}", job=job, attempt=0, action=action, kind=kind,
                    ts=ts)


def test_decision_filters() -> None:
    assert DecisionFilter().keeps(dec())
    assert DecisionFilter(actions=frozenset({"fail", "restart"})).keeps(dec())
    assert not DecisionFilter(actions=frozenset({"fail"})).keeps(dec())
    assert DecisionFilter(kinds=frozenset({"hang"})).keeps(dec(kind="hang"))
    assert not DecisionFilter(kinds=frozenset({"hang"})).keeps(dec())
    assert not DecisionFilter(job="k").keeps(dec())
    assert not DecisionFilter(since=101.0).keeps(dec())
    assert not DecisionFilter(until=99.0).keeps(dec())
    assert DecisionFilter(job="j", actions=frozenset({"restart"}), kinds=frozenset({"error"}),
                          since=100.0, until=100.0).keeps(dec())
