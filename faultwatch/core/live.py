"""A job's liveness of a batch (outputs and progress marks) folded at once: one copy of the
state for a run of them, the state apply() gives one signal after another."""

from __future__ import annotations

from collections.abc import Sequence
from functools import partial

from faultwatch.core.events import Output, ProgressBatch, Signal
from faultwatch.core.folds import Gap, add_gaps, advance, stage_key
from faultwatch.core.membership import holds
from faultwatch.core.pmap import EMPTY
from faultwatch.core.progress import RankProg
from faultwatch.core.state import (
    MAX_PENDING_GAPS,
    MAX_TAIL,
    JobState,
    NodeState,
    evolve,
    node_with,
)
from faultwatch.core.windows import WARMUP_OUTPUTS, WARMUP_STEPS

_new_prog = partial(tuple.__new__, RankProg)  # a RankProg of a tuple, in C
LIVE = (Output, ProgressBatch)  # the signals fold_live takes: they fold, never decide


def fold_live(st: JobState, sigs: Sequence[Signal], start: int, now: float
              ) -> tuple[JobState, int]:
    """Fold sigs[start:] while they are outputs and progress batches of the state's run and
    attempt, from nodes it holds (what apply() admits and folds without deciding); returns
    the state and the index of the first signal not taken (apply() has the rest: other
    signals, and liveness it refuses, ignores or starts an attempt with).

    The state's maps (nodes, ranks' last output, ranks' progress, gap histograms) are each
    copied once for the run, not once per signal (core/folds.py has the one-signal folds
    this equals: fold_output, fold_steps)."""
    n = len(sigs)
    i = start
    attempt, run_ids, allocation = st.attempt, st.run_ids, st.allocation
    # what the folds read and write, as locals; the state is built once at the end
    nodes = st.nodes
    node_new: dict[str, NodeState] = {}
    ranks = st.rank_last_ts
    rank_old = ranks.getter()
    rank_new: dict[int, float] = {}
    progress = st.progress
    prog_old = progress.getter()
    prog_new: dict[int, RankProg] = {}
    tail = st.tail
    last_output_ts = st.last_output_ts
    outputs = st.outputs
    since_step = st.outputs_since_step
    pending = st.pending_gaps
    step_ts = st.step_ts
    steps = st.steps
    samples: list[Gap] = []  # gap samples for the histograms, in the order they were made
    stage_ts = st.stage_ts
    no_stages = not st.stages
    skey = stage_key(st)  # stages do not change in a run of liveness
    outputs_seen = False
    while i < n:
        sig = sigs[i]
        kind = type(sig)
        if kind is not Output and kind is not ProgressBatch:
            break
        assert isinstance(sig, (Output, ProgressBatch))
        rid = sig.run_id
        if sig.attempt != attempt or (rid and run_ids and rid not in run_ids) \
                or not holds(allocation, sig.node):
            break  # apply() refuses it, ignores it or starts its attempt
        i += 1
        if isinstance(sig, Output):
            outputs_seen = True
            node = sig.node
            ns = node_new.get(node)
            if ns is None:
                ns = nodes.get(node) or NodeState(node=node, started_ts=sig.ts)
            ts = sig.ts
            last = ns.last_output_ts
            last = ts if last is None or ts > last else last
            ranked = False
            for rank, rts in sig.rank_last_ts:
                if rank is None:
                    key = -1
                else:
                    key = rank
                    ranked = True
                old = rank_new.get(key)
                if old is None:
                    old = rank_old(key)
                if old is None or rts > old:
                    rank_new[key] = rts
            if sig.tail:
                tail = (tail + sig.tail)[-MAX_TAIL:]
            prev = last_output_ts
            warmed_up = steps >= WARMUP_STEPS or (steps == 0 and outputs >= WARMUP_OUTPUTS)
            if prev is not None and ts > prev and warmed_up \
                    and (stage_ts is None or stage_ts < prev) and skey is not None:
                if steps == 0:
                    samples.append((skey, ts - prev, ts))
                else:
                    pending = pending + ((skey, ts - prev, ts),)
                    if len(pending) > MAX_PENDING_GAPS:
                        samples.append(pending[0])
                        pending = pending[1:]
            last_output_ts = ts if prev is None or ts > prev else prev
            if ns.ranked or not ranked:
                ns = node_with(ns, last_output_ts=last, seen_at=now)
            else:
                ns = node_with(ns, last_output_ts=last, seen_at=now, ranked=True)
            node_new[node] = ns
            outputs += 1
            since_step += 1
            continue
        node = sig.node  # a progress batch: each mark a rank's step (folds.fold_steps)
        for mark in sig.marks:
            rank, ts, step = mark[0], mark[1], mark[2]
            key = -1 if rank is None else rank
            prevp = prog_new.get(key)
            if prevp is None:
                prevp = prog_old(key)
            # progress.fold_step with no step time, inline (one call fewer per mark); an
            # advance counts toward the warm-up and makes gap samples (folds.fold_steps)
            if prevp is None:
                prog_new[key] = _new_prog((step, ts, None, 0, node))
                if step_ts is None:
                    step_ts = ts
                continue
            if step == prevp.step:
                if prevp.node != node:
                    prog_new[key] = _new_prog((step, prevp.ts, prevp.step_time_s,
                                               prevp.strikes, node))
                else:
                    prog_new[key] = prevp
                continue
            prog_new[key] = _new_prog((step, ts if ts > prevp.ts else prevp.ts,
                                       prevp.step_time_s, prevp.strikes, node))
            pending, step_ts, steps = advance(samples, pending, step_ts, steps, prevp.step,
                                              step, ts, no_stages, stage_ts)
            since_step = 0
    if i == start:
        return st, i
    changes: dict[str, object] = {
        "step_ts": step_ts, "steps": steps, "pending_gaps": pending,
        "outputs_since_step": since_step}
    if prog_new:
        changes["progress"] = progress.update(prog_new)
    if samples:
        changes["hists"] = add_gaps(st.hists, samples)
    if outputs_seen:
        changes.update(nodes=nodes.update(node_new), rank_last_ts=ranks.update(rank_new),
                       tail=tail, last_output_ts=last_output_ts, outputs=outputs,
                       diagnoses=EMPTY if st.diagnoses else st.diagnoses)
    return evolve(st, **changes), i
