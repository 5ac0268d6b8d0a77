"""fold_live (a run of outputs and progress batches folded with one state copy) gives the
state and decisions apply() gives one signal after another, on random jobs: several nodes
and attempts, records of other runs and attempts, unallocated nodes, stages, rank-less
lines, sharded rank maps, long stretches without a step (pending gaps overflow)."""

from __future__ import annotations

import random

import pytest

from faultwatch.core.events import (
    Exit,
    Heartbeat,
    Hit,
    Match,
    Notice,
    Output,
    ProgressBatch,
    RankStep,
    RunStart,
    Signal,
    Stage,
    TailLine,
)
from faultwatch.core.job import JobState, apply, apply_batch, new_state
from faultwatch.core.live import fold_live
from faultwatch.core.pmap import PMap
from faultwatch.core.policy import Policy
from faultwatch.core.state import evolve

T0 = 1_700_000_000.0
POLICY = Policy(hang_window_s=8.0, settle_s=0.5, node_lost_s=30.0)


def random_job(seed: int) -> list[Signal]:
    rng = random.Random(seed)
    n_nodes = rng.choice((1, 2, 3))
    per_node = rng.choice((1, 4, 8, 20))  # 3 x 20 ranks: the rank maps shard (> 32 keys)
    nodes = [f"n{k}" for k in range(n_nodes)]
    world = n_nodes * per_node
    rid = "" if seed % 3 == 1 else "r"  # agents older than run ids: the state holds none
    sigs: list[Signal] = [RunStart("j", 0, n, T0, run_id=rid, world_size=world,
                                   nnodes=n_nodes) for n in nodes]
    t = T0 + 1
    attempt = 0
    step = rng.randint(0, 3)
    quiet_steps = seed % 7 == 0  # a long stretch of output without a step (pending gaps)
    for k in range(rng.randint(20, 120)):
        t += rng.choice((0.0, 0.01, rng.uniform(0.1, 3.0), rng.uniform(5, 20)))
        r = rng.random()
        if quiet_steps and 10 < k < 80:
            r = 0.0
        node = rng.choice(nodes)
        i = nodes.index(node)
        ranks = list(range(i * per_node, (i + 1) * per_node))
        run = rng.choice(("r", "r", "r", "r", "", "other"))
        att = attempt if rng.random() < 0.9 else rng.choice((attempt - 1, attempt + 1))
        who = node if rng.random() < 0.95 else "stranger"
        if r < 0.4:
            pairs = tuple((rk if rng.random() < 0.9 else None, t - rng.uniform(0, 1))
                          for rk in rng.sample(ranks, rng.randint(1, len(ranks))))
            tail = tuple(TailLine(rk, ts, f"line {step}") for rk, ts in pairs[:rng.randint(0, 3)])
            sigs.append(Output("j", att, who, t, len(pairs), pairs, tail, run_id=run))
        elif r < 0.75:
            if rng.random() < 0.6:
                step += rng.choice((0, 1, 1, 2, 40))
            marks = tuple(RankStep(rk if rng.random() < 0.95 else None,
                                   t - rng.uniform(0, 0.5),
                                   max(0, step - rng.choice((0, 0, 1))) if rng.random() < 0.97
                                   else 0, 100)
                          for rk in rng.sample(ranks, rng.randint(1, len(ranks))))
            sigs.append(ProgressBatch("j", att, who, marks, run_id=run))
        elif r < 0.83:
            sigs.append(Heartbeat("j", att, who, t, True, t - rng.uniform(0, 15), T0,
                                  run_id=run))
        elif r < 0.87:
            opens = rng.random() < 0.5
            sigs.append(Stage("j", att, who, t, rng.choice(ranks), "checkpoint", opens,
                              60.0 if opens else None, run_id=run))
        elif r < 0.89:
            sigs.append(Notice("j", att, who, t, "note", {"text": "x"}, run_id=run))
        elif r < 0.91:
            m = Match("python-network-error", "retryable", False, t, "ConnectionError: x",
                      rng.choice(ranks))
            sigs.append(Hit("j", att, who, m, run_id=run))
        elif r < 0.93:
            sigs.append(Exit("j", att, who, t, rng.choice((0, 1)), run_id=run))
        elif r < 0.95 and attempt < 3:
            attempt += 1
            sigs += [RunStart("j", attempt, n, t, run_id=rid, world_size=world,
                              nnodes=n_nodes) for n in nodes]
    return sigs


def one_by_one(st: JobState, sigs: list[Signal], now: float,
               seen: list[JobState] | None = None) -> tuple[JobState, list]:
    decs: list = []
    for sig in sigs:
        st, new = apply(st, sig, now, POLICY)
        decs += new
        if seen is not None:
            seen.append(st)
    return st, decs


@pytest.mark.parametrize("seed", range(300))
def test_apply_batch_equals_apply_one_by_one_on_random_jobs(seed: int) -> None:
    sigs = random_job(seed)
    st0 = new_state(sigs[0])
    assert st0 is not None
    if seed % 5 == 0:  # a run the scheduler says holds the job's nodes (others are refused)
        st0 = evolve(st0, allocation=frozenset({"n0", "n1", "n2"}))
    if seed % 4 == 0:  # a diagnosis answer the next output clears
        st0 = evolve(st0, diagnoses=PMap({"n0": {"ts": T0, "ranks": {}}}))
    now = T0 + 500
    ref, ref_decs = one_by_one(st0, sigs, now)
    for size in (3, len(sigs)):
        st, decs = st0, []
        for i in range(0, len(sigs), size):
            st, new = apply_batch(st, sigs[i:i + size], now, POLICY)
            decs += new
        assert st.to_dict() == ref.to_dict()
        assert decs == ref_decs


def test_the_random_jobs_reach_what_the_fold_must_match() -> None:
    """The generator is a control: its jobs fold liveness runs, refuse and ignore records,
    shard rank maps, overflow pending gaps, and decide."""
    took = refused = sharded = overflowed = decided = 0
    for seed in range(300):
        sigs = random_job(seed)
        st0 = new_state(sigs[0])
        assert st0 is not None
        seen: list[JobState] = []
        st, decs = one_by_one(st0, sigs, T0 + 500, seen)
        decided += bool(decs)
        refused += sum(st.dropped.to_dict().values()) > 0
        sharded += len(st.rank_last_ts) > 32
        overflowed += any(len(s.pending_gaps) == 32 for s in seen)
        _, j = fold_live(st0, sigs, 1, T0 + 500)
        took += j > 1
    assert min(took, refused, sharded, decided) >= 10, (took, refused, sharded, decided)
    assert overflowed >= 1


def test_fold_live_stops_at_what_apply_must_see() -> None:
    start = RunStart("j", 1, "n0", T0, run_id="r")
    st = new_state(start)
    assert st is not None
    st, _ = apply(st, start, T0, POLICY)
    assert st.attempt == 1
    out = Output("j", 1, "n0", T0 + 1, 1, ((0, T0 + 1),), run_id="r")
    for stop in (Heartbeat("j", 1, "n0", T0 + 2, True, T0 + 1, T0, run_id="r"),
                 Output("j", 2, "n0", T0 + 2, 1, ((0, T0 + 2),), run_id="r"),  # a new attempt
                 Output("j", 0, "n0", T0 + 2, 1, ((0, T0 + 2),), run_id="r"),  # an old one
                 Output("j", 1, "n0", T0 + 2, 1, ((0, T0 + 2),), run_id="x")):  # other run
        new, j = fold_live(st, [out, out, stop, out], 0, T0 + 3)
        assert j == 2 and new.outputs == st.outputs + 2
    assert fold_live(st, [out], 0, T0)[1] == 1  # the control: an output of the run is taken
