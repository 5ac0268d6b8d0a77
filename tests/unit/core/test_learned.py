"""What the processor learned from a job's earlier runs, summarised from its decisions and
status snapshot (pure): start skews (and lower bounds), the last runs only, the window."""

from __future__ import annotations

from typing import Any

from faultwatch.core.learned import LAST_RUNS, learned_from


def dec(run: str, ts: float, kind: str, attempt: int = 0, **evidence: Any) -> dict[str, Any]:
    return {"id": f"{run}-{ts}", "job": "j", "attempt": attempt, "run_id": run, "ts": ts,
            "action": "notify", "reason": {"kind": kind}, "evidence": evidence}


def test_start_skews_of_the_last_runs() -> None:
    decs = [dec(f"r{i}", 1000.0 * i, "skew", spread_s=60.0 + i, window_s=30.0)
            for i in range(8)]
    decs.append(dec("r7", 7500.0, "skew", attempt=1, first_start_ts=7000.0))  # missing nodes
    lr = learned_from(reversed(decs), None)
    assert lr.available and lr.runs == ("r7", "r6", "r5", "r4", "r3")
    assert len(lr.runs) == LAST_RUNS
    spreads = sorted((s.run_id, s.attempt, s.spread_s, s.lower_bound) for s in lr.skews)
    assert spreads[0] == ("r3", 0, 63.0, False)
    assert ("r7", 1, 500.0, True) in spreads  # at least 500 s: nodes were still missing
    assert lr.max_skew_s == 500.0 and lr.skew_floor_s == 30.0


def test_checkpoint_silences_and_the_learned_window() -> None:
    decs = [dec("r1", 500.0, "hang-deferred", why="checkpoint", silent_since=380.0),
            dec("r1", 900.0, "hang-deferred", why="no evidence that ranks wait",
                silent_since=800.0),
            dec("r1", 950.0, "hang")]
    lr = learned_from(decs, {"job": "j", "run_id": "r1", "window_s": 42.5,
                             "window_basis": "adaptive"})
    assert lr.checkpoint_silences_s == (120.0,)
    assert (lr.window_s, lr.window_basis) == (42.5, "adaptive")
    assert lr.skews == () and lr.max_skew_s is None
    d = lr.to_dict()
    assert d["runs"] == ["r1"] and d["window_s"] == 42.5


def test_malformed_records_are_skipped() -> None:
    lr = learned_from([{"run_id": "r", "reason": "x", "evidence": []}, "nope",  # type: ignore[list-item]
                       dec("r", 5.0, "skew", spread_s="soon")], None)
    assert lr.available and lr.skews == ()
