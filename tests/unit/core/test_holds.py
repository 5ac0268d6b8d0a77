"""An operator's hold of one job (core/holds.py, issue 36 item 5): a held job's restart,
blacklist and fail decisions become notices that spend nothing; bounds of a hold."""

from __future__ import annotations

import dataclasses

import pytest

from faultwatch.core.events import Decision, RunStart
from faultwatch.core.holds import (
    HOLD,
    MAX_HOLD_S,
    MUTE,
    duration_text,
    hold_decisions,
    new_hold,
    released,
)
from faultwatch.core.job import new_state

T0 = 1_700_000_000.0


def state(restarts: int = 0):  # type: ignore[no-untyped-def]
    st = new_state(RunStart("j", 0, "n0", T0, run_id="r"))
    assert st is not None
    return dataclasses.replace(st, restarts_used=restarts)


def dec(action: str, did: str = "d1") -> Decision:
    return Decision(id=did, job="j", attempt=0, action=action, kind="error", ts=T0 + 5,
                    nodes=("n0",), message="NCCL error", evidence={"first": "line"},
                    run_id="r")


def test_a_held_jobs_acting_decisions_become_notices_that_spend_nothing() -> None:
    prev = state(restarts=1)
    after = dataclasses.replace(prev, restarts_used=2, restart_times=(T0 + 5,), failed=True)
    h = new_hold(HOLD, "j", T0, 3600, "debugging", "alice@ops", "h1")
    decs = [dec("restart"), dec("blacklist", "d2"), dec("fail", "d3"), dec("notify", "d4")]
    st, out = hold_decisions(prev, after, decs, h, T0 + 5)
    assert [d.action for d in out] == ["notify"] * 4
    assert [d.evidence.get("held", {}).get("action") for d in out] == \
        ["restart", "blacklist", "fail", None]  # a notify passes unchanged
    assert out[3] is decs[3]
    assert all(d.id != o.id for d, o in zip(decs[:3], out[:3], strict=True))
    assert out[0].evidence["held"] == {"by": "alice@ops", "reason": "debugging",
                                       "until": T0 + 3600, "id": "h1", "action": "restart",
                                       "decision": "d1"}
    assert out[0].evidence["first"] == "line" and "would restart: NCCL error" in out[0].message
    assert (st.restarts_used, st.restart_times, st.failed) == (1, (), False)


@pytest.mark.parametrize("hold", [
    None,
    new_hold(MUTE, "j", T0, 3600, "noisy", "bob", "m1"),  # a mute does not stop actions
    new_hold(HOLD, "j", T0 - 7200, 3600, "old", "bob", "h0"),  # ended an hour ago
    released(new_hold(HOLD, "j", T0, 3600, "x", "bob", "h2"), T0 + 1, "carol"),
])
def test_no_hold_in_force_changes_nothing(hold: object) -> None:
    prev, decs = state(), [dec("restart")]
    after = dataclasses.replace(prev, restarts_used=1)
    st, out = hold_decisions(prev, after, decs, hold, T0 + 5)  # type: ignore[arg-type]
    assert st is after and out is decs


def test_a_hold_is_bounded_and_says_who_and_until_when() -> None:
    with pytest.raises(ValueError, match="at most 7 days"):
        new_hold(HOLD, "j", T0, MAX_HOLD_S + 1, "r", "a", "i")
    with pytest.raises(ValueError, match="more than 0 s"):
        new_hold(HOLD, "j", T0, 0, "r", "a", "i")
    with pytest.raises(ValueError, match="characters"):
        new_hold(MUTE, "j", T0, 60, "x" * 501, "a", "i")
    h = new_hold(HOLD, "j", T0, 7200 + 60, "debugging", "alice@ops", "i")
    assert h.describe(T0 + 60) == ("held by alice@ops for 2h more (until "
                                   "2023-11-15T00:14:20Z): debugging")
    assert not h.in_force(h.until) and h.in_force(h.until - 1)
    r = released(h, T0 + 100, "bob@ops")
    assert r.released and not r.in_force(T0 + 100) and r.by == "bob@ops"
    assert [duration_text(s) for s in (5, 90, 3725, 90000)] == ["5s", "1m30s", "1h2m", "1d1h"]
