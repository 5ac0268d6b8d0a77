"""A ProgressBatch (every rank's last step of a batch of lines, issue 14) folds into exactly
the state its marks give folded one by one as single-rank Progress signals, in order:
learned windows (step gaps, pending output gaps, warm-up), stall clocks and hang decisions
depend on it."""

from __future__ import annotations

import random

import pytest

from faultwatch.core.events import (
    Heartbeat,
    Output,
    Progress,
    ProgressBatch,
    RankStep,
    RunStart,
    Signal,
    Stage,
    TailLine,
)
from faultwatch.core.folds import fold_progress, fold_progress_batch
from faultwatch.core.job import JobState, apply, new_state
from faultwatch.core.policy import Policy
from faultwatch.core.windows import STEPS_HIST

T0 = 1_700_000_000.0
POLICY = Policy(hang_floor_s=5.0, hang_ceiling_s=60.0, settle_s=0.5, node_lost_s=30.0)
NODES = ("n0", "n1")


def singles(b: ProgressBatch) -> list[Progress]:
    """The single-rank signals a batch stands for (what the matcher sent before)."""
    return [Progress(b.job, b.attempt, b.node, m.ts, m.rank, m.step, m.total, run_id=b.run_id)
            for m in b.marks]


def random_marks(rng: random.Random, t: float, steps: dict[int | None, int],
                 ranks: list[int | None]) -> tuple[RankStep, ...]:
    """Some ranks of the node (or the unprefixed rank None), in line order: steps advance
    by 0-15 (a bar's counter jumps), sometimes restart at 0; a rank may appear twice and
    timestamps may go backwards a little (lines of several streams)."""
    out = []
    for _ in range(rng.randint(1, 2 * len(ranks))):
        r = rng.choice(ranks)
        s = steps.get(r, 0)
        s = 0 if rng.random() < 0.03 else s + rng.choice((0, 0, 1, 1, 1, 2, 5, 15))
        steps[r] = s
        out.append(RankStep(r, t + rng.uniform(-0.3, 0.3), s, rng.choice((None, 500))))
    return tuple(out)


def random_job(seed: int) -> list[Signal]:
    """Two nodes of 4 or (odd seeds) 24 ranks, so the job's rank maps outgrow one shard:
    outputs (pending gaps), progress batches, a stage now and then, heartbeats; the run
    ends quiet so the learned window decides a hang."""
    rng = random.Random(seed)
    per_node = 24 if seed % 2 else 4
    sigs: list[Signal] = [RunStart("j", 0, n, T0, run_id="r", world_size=8, nnodes=2)
                          for n in NODES]
    steps: dict[int | None, int] = {}
    t = T0 + 1
    open_stage = False
    for _ in range(rng.randint(30, 90)):
        t += rng.uniform(0.2, 2.0)
        i = rng.randrange(2)
        n = NODES[i]
        r = per_node * i
        sigs.append(Output("j", 0, n, t, 3, ((r, t),), (TailLine(r, t, "x"),), run_id="r"))
        if rng.random() < 0.8:
            sigs.append(ProgressBatch("j", 0, n, random_marks(
                rng, t, steps, [None, *range(r, r + per_node)]), "r"))
        if rng.random() < 0.05:
            sigs.append(Stage("j", 0, n, t, r, "checkpoint", not open_stage, 30.0,
                              run_id="r"))
            open_stage = not open_stage
        if rng.random() < 0.3:
            sigs.append(Heartbeat("j", 0, n, t + 0.1, True, t, T0, run_id="r"))
    for k in range(1, 40):
        sigs += [Heartbeat("j", 0, n, t + 2 * k, True, t, T0, run_id="r") for n in NODES]
    return sigs


def run(sigs: list[Signal], *, expand: bool) -> tuple[list[JobState], list]:
    st = new_state(sigs[0])
    assert st is not None
    states, decs = [], []
    for sig in sigs:
        now = getattr(sig, "ts", T0)
        for s in singles(sig) if expand and isinstance(sig, ProgressBatch) else [sig]:
            st, new = apply(st, s, now, POLICY)
            decs += new
        states.append(st)
    return states, decs


@pytest.mark.parametrize("seed", range(40))
def test_a_batch_folds_like_its_marks_one_by_one(seed: int) -> None:
    sigs = random_job(seed)
    batched, bdecs = run(sigs, expand=False)
    single, sdecs = run(sigs, expand=True)
    for i, (b, s) in enumerate(zip(batched, single, strict=True)):
        assert b == s, f"seed {seed}: states differ after signal {i}: {sigs[i]}"
    for b, s in ((batched[-1], single[-1]), (batched[len(sigs) // 2], single[len(sigs) // 2])):
        assert b.to_dict() == s.to_dict()
        # the same order too: slow-rank scans and evidence iterate these maps
        assert list(b.progress.items()) == list(s.progress.items())
        assert list(b.hists.items()) == list(s.hists.items())
    assert bdecs == sdecs


def test_the_random_jobs_exercise_what_the_fold_must_keep() -> None:
    """Positive controls for the property above: the random jobs learn step gaps, hold
    output gaps for the next advance, see more than one rank per batch, decide hangs, and
    outgrow one shard of the rank map."""
    learned = pending = multi = hangs = sharded = 0
    for seed in range(40):
        sigs = random_job(seed)
        states, decs = run(sigs, expand=False)
        learned += any(STEPS_HIST in st.hists for st in states)
        pending += any(st.pending_gaps for st in states)
        multi += any(isinstance(s, ProgressBatch) and len({m.rank for m in s.marks}) > 1
                     for s in sigs)
        hangs += any(d.kind == "hang" for d in decs)
        sharded += len(states[-1].progress) > 32
    assert learned >= 30 and pending >= 30 and multi == 40 and hangs >= 30 \
        and sharded >= 15, (learned, pending, multi, hangs, sharded)


def test_fold_progress_batch_is_one_copy_with_every_rank() -> None:
    st = new_state(RunStart("j", 0, "n0", T0, run_id="r"))
    assert st is not None
    b = ProgressBatch("j", 0, "n0", (RankStep(0, T0 + 1, 3), RankStep(1, T0 + 1, 4),
                                      RankStep(None, T0 + 2, 9, 10)), "r")
    folded = fold_progress_batch(st, b)
    one_by_one = st
    for p in singles(b):
        one_by_one = fold_progress(one_by_one, p)
    assert folded == one_by_one
    assert {r: (p.step, p.ts, p.node) for r, p in folded.progress.items()} == \
        {0: (3, T0 + 1, "n0"), 1: (4, T0 + 1, "n0"), -1: (9, T0 + 2, "n0")}
    assert st.progress == {}  # the state folded into is left as it was
