"""The per-job state machine: signals in, decisions out, time passed in, no I/O.

state.py holds the data and its folds; the detectors are functions over it: windows.py
(fixed, stage and adaptive silence windows), progress.py (step advances, slow ranks),
spares.py (hot spares: registration, liveness, which spare replaces which node),
decide.py (budget, storm guard, blacklists), silence.py (hang, exit hang, progress stall,
node lost), failure.py (errors and exits), notices.py (SDK/agent notes, start skew),
divergence.py (NaN/inf losses and loss spikes). This
module only dispatches; nothing below imports it.
"""

from __future__ import annotations

from collections.abc import Sequence

from faultwatch.core import divergence, failure, notices, silence, spares
from faultwatch.core.decide import decision_id
from faultwatch.core.diagnosis import DIAGNOSIS_NOTE, fold_answer
from faultwatch.core.events import (
    Decision,
    Exit,
    Heartbeat,
    Hit,
    LossBatch,
    Notice,
    Output,
    Progress,
    ProgressBatch,
    RankLoss,
    RunStart,
    Signal,
    Stage,
)
from faultwatch.core.folds import (
    fold_exit,
    fold_heartbeat,
    fold_hit,
    fold_output,
    fold_progress,
    fold_progress_batch,
    fold_stage,
    fold_start,
    new_attempt,
)
from faultwatch.core.live import LIVE, fold_live
from faultwatch.core.membership import NO_ANSWERS, Allocations
from faultwatch.core.policy import Policy
from faultwatch.core.runs import MAX_ATTEMPT_STEP, admit, count_drop, new_state
from faultwatch.core.state import (
    DECIDED,
    DONE,
    RUNNING,
    SETTLING,
    JobState,
    NodeState,
    Phase,
)

__all__ = ["DECIDED", "DONE", "MAX_ATTEMPT_STEP", "RUNNING", "SETTLING", "JobState", "NodeState",
           "Phase", "apply", "apply_batch", "decision_id", "new_state", "tick"]

Result = tuple[JobState, list[Decision]]


def apply(st: JobState, sig: Signal, now: float, policy: Policy,
          rules_version: str = "", answers: Allocations = NO_ANSWERS) -> Result:
    """Fold one signal into the state; may decide from its evidence (event time).

    The state is of the job's current run (core/runs.py): a run-start of a new run returns
    a fresh state; a record of a retired or unknown run, or of an attempt no run-start
    announced, is refused (counted in `dropped`). A job with no state starts one with
    new_state(sig), which is None unless `sig` is a run-start. `answers`: the scheduler's
    allocations the shell asked for (core/membership.py)."""
    st, refused = admit(st, sig, answers)
    if refused is not None:
        return count_drop(st, refused), []
    if isinstance(sig, Notice) and sig.kind == spares.SPARE_NOTE:  # the run's, any attempt
        return spares.on_note(st, sig, now, policy, rules_version)
    if sig.attempt < st.attempt:
        return st, []  # a late record of an attempt that was already replaced
    if sig.attempt > st.attempt:
        st = new_attempt(st, sig.attempt)
    rv = rules_version
    if isinstance(sig, Output):
        return fold_output(st, sig, now), []
    if isinstance(sig, Heartbeat):
        st = fold_heartbeat(st, sig, now)
        if st.phase == Phase.SETTLING:
            return failure.settle(st, now, policy, rv)
        return silence.check(st, policy, rv)
    if isinstance(sig, ProgressBatch):  # log steps: no step times, nothing to decide
        return fold_progress_batch(st, sig), []
    if isinstance(sig, Progress):
        st, decs = notices.on_progress(fold_progress(st, sig), sig, policy, rv)
        if sig.loss is not None:
            st, more = divergence.on_losses(
                st, sig.node, (RankLoss(sig.rank, sig.ts, sig.loss, "sdk:loss"),), policy, rv)
            decs = decs + more
        return st, decs
    if isinstance(sig, LossBatch):
        return divergence.on_losses(st, sig.node, sig.marks, policy, rv)
    if isinstance(sig, Hit):
        return fold_hit(st, sig, now), []
    if isinstance(sig, RunStart):
        st = spares.started(fold_start(st, sig, now), sig.node)
        return notices.on_start(st, sig, policy, rv)
    if isinstance(sig, Exit):
        st = fold_exit(st, sig, now)
        if st.phase == Phase.RUNNING:
            return silence.check(st, policy, rv)
        if st.phase == Phase.SETTLING:
            return failure.settle(st, now, policy, rv)
        return st, []
    if isinstance(sig, Stage):
        return fold_stage(st, sig), []
    if isinstance(sig, Notice):
        if sig.kind == DIAGNOSIS_NOTE:
            return fold_answer(st, sig), []
        return notices.on_notice(st, sig, policy, rv)
    return st, []


def apply_batch(st: JobState, sigs: Sequence[Signal], now: float, policy: Policy,
                rules_version: str = "", answers: Allocations = NO_ANSWERS) -> Result:
    """Fold a job's signals in order (a bundle, as the matcher stage sends them): the same
    state and decisions as apply() one by one, without the caller's per-signal bookkeeping.
    Every signal must be of this job. Runs of outputs and progress batches fold at once
    (core/live.py); apply() is the reference it equals."""
    decs: list[Decision] = []
    i, n = 0, len(sigs)
    while i < n:
        if type(sigs[i]) in LIVE:  # a run of outputs and progress: one state copy
            st, i = fold_live(st, sigs, i, now)
            if i >= n:
                break
        st, new = apply(st, sigs[i], now, policy, rules_version, answers)
        i += 1
        if new:
            decs += new
    return st, decs


def tick(st: JobState, now: float, policy: Policy, rules_version: str = "", *,
         live_clock: bool = False, caught_up: bool = True) -> Result:
    """Advance processor time: the settle fallback when the shell says it is caught up
    (failure.settle), and node-lost checks when the shell says its clock may be trusted
    (caught up, past the grace after assignment/recovery)."""
    decs: list[Decision] = []
    if live_clock and st.spares and policy.node_lost_detection and st.phase != Phase.DONE \
            and not st.failed:
        st, decs = spares.check_lost(st, now, policy, rules_version)  # notices only
    if st.phase == Phase.SETTLING:
        st, more = failure.settle(st, now, policy, rules_version, caught_up=caught_up,
                                  timer=True)
        return st, decs + more
    if live_clock and st.phase == Phase.RUNNING and policy.node_lost_detection:
        st, more = silence.check_lost(st, now, policy, rules_version)
        return st, decs + more
    return st, decs
