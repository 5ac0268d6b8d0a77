"""Quiet: the first of each (event, reason) in full, then counts in a periodic summary."""

from __future__ import annotations

from typing import Any

from faultwatch.eventlog import Quiet


def test_repeats_are_counted_and_summarised_once_per_interval() -> None:
    out: list[tuple[str, dict[str, Any]]] = []
    now = [0.0]
    q = Quiet(lambda e, **f: out.append((e, f)), ["refused"], interval_s=60,
              clock=lambda: now[0])
    for i in range(1000):
        now[0] = i * 0.01
        q("refused", reason="unsigned", id=i)
    q("refused", reason="forged", id="x")  # a new reason: logged in full
    q("other", a=1)  # not summarised: passes
    assert [e for e, _ in out] == ["refused", "refused", "other"]
    now[0] = 61.0
    q("refused", reason="unsigned", id="late")
    assert out[-1][0] == "refused_summary" and out[-1][1]["count"] == 1000
    assert out[-1][1]["by"] == "unsigned:1000"
    q.flush()
    assert out[-1][0] == "refused_summary"  # nothing left: no new line
    assert len(out) == 4


def test_a_flood_that_stopped_is_summarised_by_the_callers_timer() -> None:
    """Issue 35 item 7: the processor's dead letters; its report timer calls tick(), so the
    count of a flood that stopped is logged within an interval, not at the next one."""
    out: list[tuple[str, dict[str, Any]]] = []
    now = [0.0]
    q = Quiet(lambda e, **f: out.append((e, f)), ["dead_letter"], interval_s=60,
              clock=lambda: now[0])
    for i in range(10_000):
        q("dead_letter", reason="unsigned:logs", offset=i)
    q.tick()
    assert [e for e, _ in out] == ["dead_letter"]  # within the interval: nothing yet
    now[0] = 60.0
    q.tick()
    assert out[-1] == ("dead_letter_summary", {"count": 9999, "total": 10_000,
                                               "by": "unsigned:logs:9999", "interval_s": 60})
    q.tick()
    assert len(out) == 2
