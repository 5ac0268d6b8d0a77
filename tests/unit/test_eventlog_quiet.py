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
