"""apply_batch folds a job's signals at once with the same result as apply one by one, and
evolve/node_with copy states like dataclasses.replace (issue 14: the per-signal cost)."""

from __future__ import annotations

import dataclasses
import random

import pytest

from faultwatch.core.events import (
    Exit,
    Heartbeat,
    Hit,
    Match,
    Output,
    Progress,
    RunStart,
    Signal,
    Stage,
    TailLine,
)
from faultwatch.core.job import JobState, apply, apply_batch, new_state
from faultwatch.core.policy import Policy
from faultwatch.core.state import NodeState, evolve, node_with

T0 = 1_700_000_000.0
POLICY = Policy(hang_window_s=8.0, settle_s=0.5, node_lost_s=30.0)


def fleet_job(seed: int) -> list[Signal]:
    """Two nodes of 4 ranks: steps with outputs and progress, a checkpoint stage, heartbeats,
    then either a hang (heartbeats only) or a root error and non-zero exits."""
    rng = random.Random(seed)
    sigs: list[Signal] = [RunStart("j", 0, n, T0, run_id="r", world_size=8, nnodes=2)
                          for n in ("n0", "n1")]
    t = T0 + 1
    for step in range(1, 40):
        t += rng.uniform(0.5, 1.5)
        for i, n in enumerate(("n0", "n1")):
            ranks = range(4 * i, 4 * i + 4)
            sigs.append(Output("j", 0, n, t, 4, tuple((r, t) for r in ranks),
                               (TailLine(4 * i, t, f"step {step}"),), run_id="r"))
            sigs += [Progress("j", 0, n, t, r, step, step_time_s=rng.uniform(0.9, 1.1),
                              run_id="r") for r in ranks]
            sigs.append(Heartbeat("j", 0, n, t + 0.2, True, t, T0, run_id="r"))
        if step == 20:
            sigs.append(Stage("j", 0, "n0", t, 0, "checkpoint", True, 60.0, run_id="r"))
        if step == 22:
            sigs.append(Stage("j", 0, "n0", t, 0, "checkpoint", False, run_id="r"))
    if seed % 2:
        for k in range(1, 8):
            sigs += [Heartbeat("j", 0, n, t + 2 * k, True, t, T0, run_id="r")
                     for n in ("n0", "n1")]
    else:
        m = Match("python-network-error", "retryable", False, t + 1, "ConnectionError: x", 3)
        sigs += [Hit("j", 0, "n0", m, run_id="r"),
                 Exit("j", 0, "n0", t + 2, 1, run_id="r"),
                 Exit("j", 0, "n1", t + 3, 1, run_id="r"),
                 Heartbeat("j", 0, "n1", t + 5, False, t, T0, run_id="r")]
    return sigs


@pytest.mark.parametrize("seed", [1, 2, 3, 4])
def test_apply_batch_equals_apply_one_by_one(seed: int) -> None:
    sigs = fleet_job(seed)
    st0 = new_state(sigs[0])
    assert st0 is not None
    st, decs = st0, []
    for sig in sigs:
        st, new = apply(st, sig, T0 + 100, POLICY)
        decs += new
    for size in (1, 7, len(sigs)):  # batches of several sizes
        bst, bdecs = st0, []
        for i in range(0, len(sigs), size):
            bst, new = apply_batch(bst, sigs[i:i + size], T0 + 100, POLICY)
            bdecs += new
        assert bst.to_dict() == st.to_dict() and bdecs == decs
    assert [d.kind for d in decs if d.kind != "diagnose"] == \
        (["hang"] if seed % 2 else ["error"])  # the control: something was decided


def test_evolve_and_node_with_copy_like_replace() -> None:
    st = JobState(job="j", attempt=2, steps=5)
    new = evolve(st, steps=6, outputs=3)
    assert new == dataclasses.replace(st, steps=6, outputs=3) and st.steps == 5
    assert new is not st and new.job == "j"
    with pytest.raises(TypeError, match="no field"):
        evolve(st, stepz=1)
    ns = NodeState(node="n0", started_ts=T0, rank=3)
    assert node_with(ns, alive=False, seen_at=T0 + 1) == dataclasses.replace(
        ns, alive=False, seen_at=T0 + 1)
    with pytest.raises(TypeError, match="no field"):
        node_with(ns, bogus=1)
    with pytest.raises(dataclasses.FrozenInstanceError):
        new.steps = 7  # type: ignore[misc]
