"""Run identity: which job run a record belongs to, when a run-start begins a fresh run, and
which records are refused (retired or unknown runs, absurd attempts).

A job name is reused (Slurm array tasks, re-created K8s Jobs, a second `faultwatch agent
--job J`), so the job stage keeps the state of the name's *current run* only:
- A run-start of another run begins a fresh state (the old run is retired, remembered in a
  bounded list) when its source is a scheduler or a flag, or when the current run is over
  (done, decided `fail`, or every node exited). A generated run id (or none given by an
  agent older than run identity: source "") arriving while the run is active joins it:
  multi-node jobs without a scheduler identity keep working; so does one of a later attempt
  after the run decided a restart (an agent relaunched by its scheduler with the next attempt).
- Other records of a retired or unknown run are refused and counted, never applied.
- The attempt moves forward only by a run-start, by at most MAX_ATTEMPT_STEP beyond the
  current attempt (a restart decision is what makes the agent send it); other records of a
  higher attempt are refused.
- Records without a run id (older agents) are checked by attempt only.
"""

from __future__ import annotations

from faultwatch.core.events import RunStart, Signal
from faultwatch.core.state import JobState, Phase, evolve, freeze

MAX_ATTEMPT_STEP = 3  # a run-start may move the attempt at most this far at once
MAX_RETIRED = 32  # retired run ids remembered per job name
MAX_RUN_IDS = 4096  # run ids joined into one run (one per node of a generated multi-node job)
JOINING_SOURCES = ("generated", "")


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


def admit(st: JobState, sig: Signal) -> tuple[JobState, str | None]:
    """The state `sig` applies to (the same, a fresh run, or the run joined by it), or the
    reason it is refused."""
    rid = sig.run_id
    if not isinstance(sig, RunStart):
        if rid and st.run_ids and rid not in st.run_ids:
            return st, "retired-run" if rid in st.retired else "unknown-run"
        if sig.attempt > st.attempt:
            return st, "attempt-ahead"
        return st, None
    if rid and rid in st.retired:
        return st, "retired-run"
    if rid and st.run_ids and rid not in st.run_ids:
        if sig.run_source not in JOINING_SOURCES or (run_over(st) and not _continues(st, sig)):
            return fresh_run(st, sig), None
    elif not st.nodes and not st.run_ids:  # the first run-start this state sees
        return _member(st, sig), None
    if sig.attempt > st.attempt + MAX_ATTEMPT_STEP:
        return st, "attempt-jump"
    return _member(st, sig), None


def _continues(st: JobState, sig: RunStart) -> bool:
    """A generated run-start of a later attempt after this run decided a restart: the agent
    was relaunched by its scheduler with the next attempt (a new process, a new generated
    id), not a new submission (which starts at attempt 0). It keeps the run's budgets."""
    return (st.phase == Phase.DECIDED and not st.failed
            and st.attempt < sig.attempt <= st.attempt + MAX_ATTEMPT_STEP)


def fresh_run(st: JobState, sig: RunStart) -> JobState:
    """A new state for the run `sig` starts; the current run's ids are retired."""
    old = tuple(sorted(r for r in st.run_ids if r not in st.retired))
    return _member(JobState(job=st.job, attempt=sig.attempt, retired=(st.retired + old)
                            [-MAX_RETIRED:], dropped=st.dropped), sig)


def _member(st: JobState, sig: RunStart) -> JobState:
    """`sig`'s run id (if any) is one of the run's; the first one names the run."""
    if not sig.run_id or sig.run_id in st.run_ids:
        return st
    if len(st.run_ids) >= MAX_RUN_IDS:
        return st
    if st.run_id:
        return evolve(st, run_ids=st.run_ids | {sig.run_id})
    return evolve(st, run_id=sig.run_id, run_source=sig.run_source,
                               scheduler=freeze(dict(sig.scheduler)),
                               run_ids=st.run_ids | {sig.run_id})


def count_drop(st: JobState, reason: str) -> JobState:
    return evolve(st, dropped=st.dropped.set(reason, st.dropped.get(reason, 0) + 1))
