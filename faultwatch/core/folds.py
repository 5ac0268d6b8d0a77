"""The pure folds of one signal into a job's state (core/state.py): no decisions."""
from __future__ import annotations

from collections.abc import Iterable

from faultwatch.core.events import (
    Exit,
    Heartbeat,
    Hit,
    Output,
    Progress,
    ProgressBatch,
    RunStart,
    Stage,
)
from faultwatch.core.pmap import EMPTY, PMap
from faultwatch.core.progress import RankProg, fold_step
from faultwatch.core.start import start_hold_s
from faultwatch.core.state import (
    ATTEMPT_RESET,
    MAX_HITS,
    MAX_PENDING_GAPS,
    MAX_TAIL,
    JobState,
    NodeState,
    Phase,
    evolve,
    node_with,
)
from faultwatch.core.windows import (
    DEFAULT_STAGE,
    STEP_WEIGHT_MAX,
    STEPS_HIST,
    WARMUP_STEPS,
    GapHist,
    OpenStage,
)


def new_attempt(st: JobState, attempt: int) -> JobState:
    """Reset every attempt-scoped field (and the dataclass default of each) for `attempt`."""
    return evolve(st, attempt=attempt, phase=Phase.RUNNING, **ATTEMPT_RESET)


def fold_start(st: JobState, ev: RunStart, now: float) -> JobState:
    ns = NodeState(node=ev.node, started_ts=ev.ts, run_id=ev.run_id,
                   world_size=ev.world_size, rank=ev.rank, seen_at=now,
                   start_hold_s=start_hold_s(ev.cmd), ranked=ev.rank is not None)
    phase = Phase.RUNNING if st.phase == Phase.DONE else st.phase
    world = max(st.expected_world or 0, ev.world_size or 0) or None
    nn = max(st.expected_nodes or 0, ev.nnodes or 0) or None
    return evolve(st, nodes=st.nodes.set(ev.node, ns), phase=phase,
                               expected_world=world, expected_nodes=nn)


def stage_key(st: JobState) -> str | None:
    """The histogram a gap belongs to: the default stage, or the single open stage."""
    if not st.stages:
        return DEFAULT_STAGE
    names = {s.stage for s in st.stages.values()}
    return names.pop() if len(names) == 1 else None


def fold_output(st: JobState, ev: Output, now: float) -> JobState:
    ns = st.node(ev.node, ev.ts)
    last = max(ns.last_output_ts or ev.ts, ev.ts)
    ranks = st.rank_last_ts
    newer: dict[int, float] = {}  # one copy of the rank map for the whole batch
    for rank, ts in ev.rank_last_ts:
        key = -1 if rank is None else rank
        old = newer.get(key)
        if old is None:
            old = ranks.get(key)
        if old is None or ts > old:
            newer[key] = ts
    ranks = ranks.update(newer)
    tail = (st.tail + ev.tail)[-MAX_TAIL:] if ev.tail else st.tail
    hists = st.hists
    pending = st.pending_gaps
    prev = st.last_output_ts
    if prev is not None and ev.ts > prev and st.warmed_up \
            and (st.stage_ts is None or st.stage_ts < prev):
        skey = stage_key(st)
        if skey is not None:
            if st.steps == 0:  # no progress reported: every gap is a sample
                hists = add_gaps(hists, ((skey, ev.ts - prev, ev.ts),))
            else:  # a sample once the job advances again (a stalled bar's redraw is none)
                pending = pending + ((skey, ev.ts - prev, ev.ts),)
                if len(pending) > MAX_PENDING_GAPS:
                    hists = add_gaps(hists, pending[:1])
                    pending = pending[1:]
    job_last = ev.ts if prev is None else max(prev, ev.ts)
    if ns.ranked or not any(rank is not None for rank, _ in ev.rank_last_ts):
        ns = node_with(ns, last_output_ts=last, seen_at=now)
    else:  # a rank printed: the launcher has assembled the job (core/start.py)
        ns = node_with(ns, last_output_ts=last, seen_at=now, ranked=True)
    return evolve(
        st, nodes=st.nodes.set(ev.node, ns),
        rank_last_ts=ranks, tail=tail, last_output_ts=job_last, outputs=st.outputs + 1,
        hists=hists, diagnoses=EMPTY if st.diagnoses else st.diagnoses,
        outputs_since_step=st.outputs_since_step + 1, pending_gaps=pending)


Gap = tuple[str, float, float]  # (histogram key, gap, when it ended)


def add_gaps(hists: PMap[str, GapHist], gaps: Iterable[Gap]) -> PMap[str, GapHist]:
    """The histograms with the gaps added in order; each histogram the gaps change is set
    once, in the order of first change (the map adding them one by one would give)."""
    changed: dict[str, GapHist] = {}
    for key, gap, _end in gaps:
        weight = 1
        if key.startswith(STEPS_HIST + ":"):  # a step gap with its weight
            key, weight = STEPS_HIST, int(key.rsplit(":", 1)[1])
        hist = changed.get(key)
        if hist is None:
            hist = hists.get(key, GapHist())
        new = hist.add(gap, weight)
        if new is not hist:
            changed[key] = new
    return hists.update(changed)


def fold_heartbeat(st: JobState, ev: Heartbeat, now: float) -> JobState:
    ns = st.node(ev.node, ev.started_ts or ev.ts)
    last = ns.last_output_ts
    if ev.last_output_ts is not None:
        last = max(last or ev.last_output_ts, ev.last_output_ts)
    alive = ev.alive and ns.exit_ts is None
    ns = node_with(ns, last_output_ts=last, last_hb_ts=ev.ts, alive=alive, seen_at=now)
    return evolve(st, nodes=st.nodes.set(ev.node, ns))


def fold_exit(st: JobState, ev: Exit, now: float) -> JobState:
    ns = node_with(st.node(ev.node, ev.ts), alive=False, exit_code=ev.exit_code,
                             signal=ev.signal, exit_ts=ev.ts, seen_at=now)
    st = evolve(st, nodes=st.nodes.set(ev.node, ns))
    if ev.stopped:  # an operator's stop: not a failure; the job is done once every node is
        if st.phase == Phase.RUNNING and not any(n.alive for n in st.nodes.values()):
            return evolve(st, phase=Phase.DONE)
        return st
    if st.phase == Phase.SETTLING and ev.exit_code != 0 and st.failure_ts is not None \
            and ev.ts < st.failure_ts:
        return evolve(st, failure_ts=ev.ts)  # an earlier failure, seen later
    if st.phase != Phase.RUNNING:
        return st
    if ev.exit_code != 0:
        return evolve(st, phase=Phase.SETTLING, failure_seen_at=now,
                                   failure_ts=ev.ts)
    if all(not n.alive and n.exit_code == 0 for n in st.nodes.values()):
        return evolve(st, phase=Phase.DONE)
    return st


def fold_progress(st: JobState, ev: Progress) -> JobState:
    """A rank's step (see fold_steps)."""
    return fold_steps(st, ev.node, ((ev.rank, ev.ts, ev.step, ev.step_time_s),))


def fold_progress_batch(st: JobState, ev: ProgressBatch) -> JobState:
    """Every rank's last step of a batch of lines: the state fold_progress gives for the
    Progress of each mark in turn, in one state copy instead of one per rank."""
    return fold_steps(st, ev.node, ((m.rank, m.ts, m.step, None) for m in ev.marks))


StepMark = tuple[int | None, float, int, float | None]  # (rank, ts, step, step_time_s)


def fold_steps(st: JobState, node: str, marks: Iterable[StepMark]) -> JobState:
    """Ranks' steps, in order. An advance of k steps (a bar's counter jumps between the
    rate-limited redraws the agent ships) counts k steps (at most STEP_WEIGHT_MAX) toward the
    warm-up and as that many samples of the gap since the job's previous advance (windows.py).
    The marks fold one after another into local values, and the state is copied once."""
    progress = st.progress
    folded: dict[int, RankProg] = {}  # ranks' new progress, in order of first mark
    step_ts = st.step_ts
    steps = st.steps
    pending = st.pending_gaps
    samples: list[Gap] = []  # pending gaps that became samples, in order
    since_step = st.outputs_since_step
    no_stages = not st.stages
    stage_ts = st.stage_ts
    for rank, ts, step, step_time_s in marks:
        key = -1 if rank is None else rank
        prev: RankProg | None = folded.get(key)
        if prev is None:
            prev = progress.get(key)
        rp, advanced = fold_step(prev, step, ts, step_time_s, node)
        folded[key] = rp
        if advanced:
            assert prev is not None
            pending, step_ts, steps = advance(samples, pending, step_ts, steps, prev.step,
                                              step, ts, no_stages, stage_ts)
            since_step = 0
        elif prev is None and step_ts is None:
            step_ts = ts
    progress = progress.update(folded)  # in first-mark order: what one by one would give
    hists = add_gaps(st.hists, samples) if samples else st.hists
    return evolve(st, progress=progress, step_ts=step_ts, steps=steps, hists=hists,
                  pending_gaps=pending, outputs_since_step=since_step)


def advance(samples: list[Gap], pending: tuple[Gap, ...], step_ts: float | None, steps: int,
            prev_step: int, step: int, ts: float, no_stages: bool, stage_ts: float | None
            ) -> tuple[tuple[Gap, ...], float | None, int]:
    """A rank's step moved from `prev_step` to `step` at `ts` (see fold_steps): the pending
    gaps that ended before it become `samples` (appended), the gap since the job's last
    advance waits for the next; returns the new pending gaps, step_ts and steps."""
    weight = min(max(step - prev_step, 1), STEP_WEIGHT_MAX)  # a bar restarting: 1
    # what waited for this advance becomes samples; what ended with it waits for the next
    held: tuple[Gap, ...] = ()
    if pending:
        samples += (g for g in pending if g[2] < ts)
        held = tuple(g for g in pending if g[2] >= ts)
    # the advance out of step 0 spans start-up (first step, compilation, first collective):
    # no sample, unless the attempt already advanced past its warm-up
    if step_ts is not None and ts > step_ts and no_stages \
            and (prev_step > 0 or steps >= WARMUP_STEPS) \
            and (stage_ts is None or stage_ts < step_ts):
        held += ((f"{STEPS_HIST}:{weight}", ts - step_ts, ts),)
    return held, (ts if step_ts is None else max(step_ts, ts)), steps + weight


def fold_stage(st: JobState, ev: Stage) -> JobState:
    key = -1 if ev.rank is None else ev.rank
    if ev.opens:
        return evolve(st, stages=st.stages.set(
            key, OpenStage(ev.stage, ev.hang_window_s, ev.ts)), stage_ts=ev.ts)
    cur: OpenStage | None = st.stages.get(key)
    if cur is None or cur.stage != ev.stage:
        return st
    # the step clock restarts when a stage ends (a long checkpoint is no stall)
    step_ts = None if st.step_ts is None else max(st.step_ts, ev.ts)
    return evolve(st, stages=st.stages.remove(key), step_ts=step_ts,
                               stage_ts=ev.ts)


def fold_hit(st: JobState, hit: Hit, now: float) -> JobState:
    """Keep the hit (the earliest MAX_HITS); a hardware root error starts settling."""
    if len(st.hits) >= MAX_HITS:
        return st
    st = evolve(st, hits=st.hits + (hit,))
    m = hit.match
    if m.category == "hardware" and not m.cascade and st.phase == Phase.RUNNING:
        st = evolve(st, phase=Phase.SETTLING, failure_seen_at=now, failure_ts=m.ts)
    return st


# ---- the field table: persistence and attempt reset derive from it -----------------------
