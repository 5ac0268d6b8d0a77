"""Run identity: which job run a record belongs to, when a run-start begins a fresh run, and
which records are refused (retired or unknown runs, nodes the run does not hold, absurd
attempts).

A job name is reused (Slurm array tasks, re-created K8s Jobs, a second `faultwatch agent
--job J`), so the job stage keeps the state of the name's *current run* only:
- Run ids come in two strengths. A *named* run (source slurm, kubernetes, torchrun, flag) has
  an id every node of it is given; a *weak* id is one a node made up (`generated`, "" from
  agents older than run identity) or derived from its launch (`rendezvous`: the same on
  every node of one launch, and on a later launch at the same endpoint).
- A run-start of another named run begins a fresh state (the old run is retired,
  remembered in a bounded list). A weak run-start of another id joins the current run while
  it is active, if that run is weak too (multi-node jobs without a shared id keep working,
  and so does an agent relaunched with the next attempt after a restart decision); it never
  joins a named run (refused as `other-run`: a node cannot add itself to another job's run
  by making up an id). Once the current run is over (done, decided `fail`, or every node
  exited) a weak run-start of attempt 0 begins a fresh run, its own id included when the
  run-start is newer than the run's evidence (a derived id launched again: `run_gen`
  counts, and decision ids differ; the old run's records sent again start nothing).
- Where the scheduler's allocation is known (core/membership.py) a node outside it is
  refused (`not-allocated`), whatever run id it claims.
- Other records of a retired or unknown run are refused and counted, never applied.
- The attempt moves forward only by a run-start, by at most MAX_ATTEMPT_STEP beyond the
  current attempt (a restart decision is what makes the agent send it); other records of a
  higher attempt are refused.
- Records without a run id (older agents) are checked by attempt only.
"""

from __future__ import annotations

from faultwatch.core.events import RunStart, Signal
from faultwatch.core.membership import (
    NAME_IN_USE,
    NO_ANSWERS,
    NOT_ALLOCATED,
    Allocations,
    allocation_key,
    answer_for,
    holds,
)
from faultwatch.core.state import JobState, Phase, evolve, freeze

MAX_ATTEMPT_STEP = 3  # a run-start may move the attempt at most this far at once
MAX_RETIRED = 32  # retired run ids remembered per job name
MAX_RUN_IDS = 4096  # run ids joined into one run (one per node of a generated multi-node job)
WEAK_SOURCES = ("generated", "rendezvous", "")
JOINING_SOURCES = WEAK_SOURCES  # (the name older callers import)
RETIRED, UNKNOWN, OTHER_RUN = "retired-run", "unknown-run", "other-run"


def new_state(sig: Signal) -> JobState | None:
    """The state a record of a job with no state starts: only a run-start starts one (a
    stray record creates no phantom job and no node-lost)."""
    return JobState(job=sig.job) if isinstance(sig, RunStart) else None


def run_over(st: JobState) -> bool:
    """The current run ended: done, decided `fail`, or every node exited (and no node the
    run-starts announced, nnodes, is still to come)."""
    if st.phase == Phase.DONE or (st.phase == Phase.DECIDED and st.failed):
        return True
    if not st.nodes or (st.expected_nodes and len(st.nodes) < st.expected_nodes):
        return False
    return all(n.exit_ts is not None for n in st.nodes.values())


def admit(st: JobState, sig: Signal, answers: Allocations = NO_ANSWERS
          ) -> tuple[JobState, str | None]:
    """The state `sig` applies to (the same, a fresh run, or the run joined by it), or the
    reason it is refused. `answers`: the scheduler's allocations the shell asked for."""
    rid = sig.run_id
    if not isinstance(sig, RunStart):
        if rid and st.run_ids and rid not in st.run_ids:
            return st, RETIRED if rid in st.retired else UNKNOWN
        if not holds(st.allocation, sig.node):
            return st, NOT_ALLOCATED
        if sig.attempt > st.attempt:
            return st, "attempt-ahead"
        return st, None
    if rid and rid in st.retired:
        return st, RETIRED
    fresh = not st.nodes and not st.run_ids  # the first run-start this state sees
    if not fresh and _new_run(st, sig):
        if not _may_replace(st, sig, answers):
            return st, NAME_IN_USE
        target = fresh_run(st, sig)
    elif not fresh and rid and st.run_ids and rid not in st.run_ids \
            and st.run_source not in WEAK_SOURCES:
        return st, OTHER_RUN  # a weak id never joins a named run
    else:
        if not fresh and sig.attempt > st.attempt + MAX_ATTEMPT_STEP:
            return st, "attempt-jump"
        target = _member(st, sig)
    target = _allocated(target, sig, answers)
    if not holds(target.allocation, sig.node):
        return st, NOT_ALLOCATED
    return target, None


def _new_run(st: JobState, sig: RunStart) -> bool:
    """`sig` begins a run other than the current one."""
    rid = sig.run_id
    if not rid:
        return False
    if rid not in st.run_ids:
        if not st.run_ids:
            return False  # a state of agents older than run ids: this one joins it
        if sig.run_source not in WEAK_SOURCES:
            return True
        return run_over(st) and not _continues(st, sig)
    # the current run's own id: a weak id launched again after the run is over, by a
    # run-start newer than all the run holds (the run's own run-start sent again, a replay
    # of its records, is no new launch)
    last = st.latest_event_ts()
    return sig.run_source in WEAK_SOURCES and sig.attempt == 0 and run_over(st) \
        and not _continues(st, sig) and (last is None or sig.ts > last)


def _may_replace(st: JobState, sig: RunStart, answers: Allocations) -> bool:
    """Another run may take the job name over unless the current one runs on nodes the
    scheduler named (checked) and `sig` comes from elsewhere while the scheduler still runs
    it (or cannot say)."""
    if st.allocation is None or st.phase not in (Phase.RUNNING, Phase.SETTLING) \
            or run_over(st) or sig.node in st.allocation:
        return True
    still = answer_for(st.scheduler, answers)
    return still is not None and not still


def _continues(st: JobState, sig: RunStart) -> bool:
    """A generated run-start of a later attempt after this run decided a restart: the agent
    was relaunched by its scheduler with the next attempt (a new process, a new generated
    id), not a new submission (which starts at attempt 0). It keeps the run's budgets."""
    return (st.phase == Phase.DECIDED and not st.failed
            and st.attempt < sig.attempt <= st.attempt + MAX_ATTEMPT_STEP)


def fresh_run(st: JobState, sig: RunStart) -> JobState:
    """A new state for the run `sig` starts; the current run's ids are retired (all but
    `sig`'s own: a weak id launched again names the new run)."""
    old = tuple(sorted(r for r in st.run_ids if r not in st.retired and r != sig.run_id))
    gen = st.run_gen + 1 if sig.run_id and sig.run_id in st.run_ids else 0
    return _member(JobState(job=st.job, attempt=sig.attempt, retired=(st.retired + old)
                            [-MAX_RETIRED:], dropped=st.dropped, run_gen=gen), sig)


def _member(st: JobState, sig: RunStart) -> JobState:
    """`sig`'s run id (if any) is one of the run's; the first one names the run."""
    if not sig.run_id or sig.run_id in st.run_ids:
        return st
    if len(st.run_ids) >= MAX_RUN_IDS:
        return st
    if st.run_id:
        return evolve(st, run_ids=st.run_ids | {sig.run_id})
    return evolve(st, run_id=sig.run_id, run_source=sig.run_source,
                  scheduler=freeze(dict(sig.scheduler)), run_ids=st.run_ids | {sig.run_id})


def _allocated(st: JobState, sig: RunStart, answers: Allocations) -> JobState:
    """The run's allocation, set or refreshed from the scheduler's answer for the job this
    run-start names when that is the run's own scheduler job."""
    if not answers:
        return st
    key = allocation_key(st.scheduler)
    if key is None or key != allocation_key(sig.scheduler) or key not in answers:
        return st
    now = answers[key]
    return st if now == st.allocation else evolve(st, allocation=now)


def count_drop(st: JobState, reason: str) -> JobState:
    return evolve(st, dropped=st.dropped.set(reason, st.dropped.get(reason, 0) + 1))
