"""Run identity in the job state: a reused job name starts fresh, records of other runs and
absurd attempts are refused, only a run-start starts a job (core/runs.py)."""

from __future__ import annotations

from faultwatch.core.events import Exit, Heartbeat, Hit, Match, Output, RunStart, Signal
from faultwatch.core.job import MAX_ATTEMPT_STEP, JobState, Phase, apply, tick
from faultwatch.core.policy import Policy
from faultwatch.core.runs import MAX_RETIRED
from tests.support import job_events as td

P = Policy(hang_window_s=5, settle_s=2, max_restarts=2, node_lost_s=20)
SLURM = {"kind": "slurm", "job_id": "77", "node": "n0"}


def feed(st: JobState | None, *sigs: Signal, now: float | None = None
         ) -> tuple[JobState | None, list]:
    return td.feed(st, *sigs, policy=P, now=now)


def start(run: str, attempt: int = 0, node: str = "n0", ts: float = 100.0,
          source: str = "slurm", **kw: object) -> RunStart:
    return RunStart("j", attempt, node, ts, run_id=run, run_source=source, **kw)  # type: ignore[arg-type]


def fatal(run: str, attempt: int, ts: float, node: str = "n0") -> list[Signal]:
    m = Match("python-module-not-found", "fatal", False, ts, "ModuleNotFoundError: x", 0)
    return [Hit("j", attempt, node, m, run_id=run),
            Exit("j", attempt, node, ts + 0.5, exit_code=1, run_id=run)]


def retryable_then_restart(run: str, source: str) -> tuple[JobState, list]:
    """Run `run` to a restart decision (attempt 0) and its attempt 1 started."""
    m = Match("connection-error", "retryable", False, 101.0, "ConnectionError", 0)
    st, decs = feed(None, start(run, source=source), Hit("j", 0, "n0", m, run_id=run),
                    Exit("j", 0, "n0", 101.5, exit_code=1, run_id=run))
    assert [d.action for d in decs] == ["restart"]
    st, _ = feed(st, start(run, attempt=1, ts=103.0, source=source))
    assert st is not None and st.attempt == 1
    return st, decs


def test_a_reused_job_name_after_a_restart_gets_its_own_failure_decided() -> None:
    """Issue 8 case 2: the old run reached attempt 1; a new run of the same name starts at
    attempt 0 and fails: that failure is decided (before: the attempt-0 records were taken
    for late records of the old run and ignored)."""
    st, _ = retryable_then_restart("slurm-1", "slurm")
    st, decs = feed(st, start("slurm-2", ts=200.0, scheduler=SLURM), *fatal("slurm-2", 0, 201.0))
    assert st is not None and (st.run_id, st.attempt) == ("slurm-2", 0)
    assert [(d.action, d.attempt, d.run_id) for d in decs] == [("fail", 0, "slurm-2")]
    assert decs[0].scheduler == SLURM and st.retired == ("slurm-1",)
    assert st.restarts_used == 0  # a new run has its own budget


def test_a_generated_run_starts_fresh_only_when_the_current_run_is_over() -> None:
    st, _ = retryable_then_restart("g-1", "generated")
    # attempt 1 of g-1 is running: another generated run joins it (a second node)
    st, _ = feed(st, start("g-2", attempt=1, node="n1", ts=104.0, source="generated"))
    assert st is not None and st.run_id == "g-1" and st.run_ids == {"g-1", "g-2"}
    assert set(st.nodes) == {"n0", "n1"}
    # both nodes finish: the run is over; the next generated run is a new one
    st, _ = feed(st, Exit("j", 1, "n0", 110.0, 0, run_id="g-1"),
                 Exit("j", 1, "n1", 110.0, 0, run_id="g-2"))
    assert st is not None and st.phase == Phase.DONE
    st, decs = feed(st, start("g-3", ts=200.0, source="generated"), *fatal("g-3", 0, 201.0))
    assert st is not None and st.run_id == "g-3" and set(st.retired) == {"g-1", "g-2"}
    assert [(d.action, d.run_id) for d in decs] == [("fail", "g-3")]


def test_records_of_retired_and_unknown_runs_are_refused_and_counted() -> None:
    st, _ = feed(None, start("r1"), start("r2", ts=150.0))
    assert st is not None and st.run_id == "r2" and st.retired == ("r1",)
    before = st
    for sig in (Exit("j", 0, "n0", 151.0, 1, run_id="r1"),  # the old run's late exit
                Output("j", 0, "n0", 151.0, 3, run_id="r1"),
                Heartbeat("j", 0, "n0", 151.0, True, None, run_id="nobody"),
                start("r1", ts=152.0)):  # an old run cannot come back
        st, decs = apply(st, sig, 151.0, P)
        assert decs == []
    assert st.nodes == before.nodes and st.phase == before.phase == Phase.RUNNING
    assert st.dropped == {"retired-run": 3, "unknown-run": 1}
    # positive control: the current run's exit is applied
    st, decs = apply(st, Exit("j", 0, "n0", 153.0, 1, run_id="r2"), 153.0, P)
    assert [d.action for d in decs] == ["fail"]


def test_an_absurd_attempt_is_ignored_and_the_real_failure_decided() -> None:
    """Issue 8 case 7 (the wire refuses attempts > 10000; in range, the core refuses what no
    run-start announced)."""
    st, _ = feed(None, start("r"))
    st, decs = feed(st, Heartbeat("j", 999, "n0", 101.0, True, None, run_id="r"),
                    start("r", attempt=999, ts=101.0),
                    start("r", attempt=MAX_ATTEMPT_STEP + 1, ts=101.0))
    assert st is not None and st.attempt == 0 and decs == []
    assert st.dropped == {"attempt-ahead": 1, "attempt-jump": 2}
    st, decs = feed(st, *fatal("r", 0, 102.0))
    assert [(d.action, d.attempt) for d in decs] == [("fail", 0)]
    # an attempt announced by a run-start within the step is taken
    st, _ = feed(None, start("r"), start("r", attempt=MAX_ATTEMPT_STEP, ts=101.0))
    assert st is not None and st.attempt == MAX_ATTEMPT_STEP


def test_a_stray_lines_record_creates_no_job_and_no_node_lost() -> None:
    """Issue 8 case 14: without a run-start there is no state, so nothing to lose."""
    st, decs = feed(None, Output("j", 0, "n0", 100.0, 10, run_id="x"),
                    Heartbeat("j", 0, "n0", 100.5, True, 100.0, run_id="x"))
    assert st is None and decs == []
    # positive control: the same records after a run-start make a job that is lost later
    st, _ = feed(None, start("x"), Output("j", 0, "n0", 100.0, 10, run_id="x"), now=100.0)
    assert st is not None
    _, decs = tick(st, 100.0 + P.node_lost_s + 1, P, live_clock=True)
    assert [d.kind for d in decs] == ["node-lost"]


def test_records_without_a_run_id_still_apply_and_ids_differ_per_run() -> None:
    """Agents older than run identity send no run id: checked by attempt only. A decision
    id includes the run, so consumers deduping by id keep the new run's decision."""
    st, decs = feed(None, RunStart("j", 0, "n0", 100.0), *fatal("", 0, 101.0))
    assert [d.run_id for d in decs] == [""]
    _, decs2 = feed(None, start("r9"), *fatal("r9", 0, 101.0))
    assert decs[0].id != decs2[0].id


def test_the_retired_list_is_bounded() -> None:
    st, _ = feed(None, *[start(f"r{i}", ts=100.0 + i) for i in range(MAX_RETIRED + 10)])
    assert st is not None and len(st.retired) == MAX_RETIRED
    assert st.retired[-1] == f"r{MAX_RETIRED + 8}" and st.run_id == f"r{MAX_RETIRED + 9}"


def test_a_late_node_of_an_announced_multi_node_run_joins_after_the_first_one_exited() -> None:
    """nnodes=2, generated run ids: n0 fails at once; n1's run-start (another generated id)
    arrives later. The run is not over while an announced node is missing: n1 joins, and
    the failure is decided with both nodes' evidence."""
    st, decs = feed(None, start("g-a", source="generated", nnodes=2),
                    Exit("j", 0, "n0", 101.0, 1, run_id="g-a"))
    assert decs == []  # settling: n1 may still report the root error
    st, decs = feed(st, start("g-b", node="n1", ts=102.0, source="generated", nnodes=2),
                    Exit("j", 0, "n1", 103.0, 1, run_id="g-b"))
    assert st is not None and st.run_ids == {"g-a", "g-b"} and st.retired == ()
    assert [(d.action, sorted(d.evidence["exits"])) for d in decs] == [("fail", ["n0", "n1"])]


def test_an_agent_relaunched_with_the_next_attempt_continues_the_run_and_its_budget() -> None:
    """A scheduler relaunches the agent (a new process, a new generated run id) with the
    attempt the restart decision asked for: that is the same run, its restart budget goes on
    (before: every relaunch looked like a new run and the budget never ran out)."""
    m = Match("connection-error", "retryable", False, 101.0, "ConnectionError", 0)
    st, decs = feed(None, start("g-a", source="generated"), Hit("j", 0, "n0", m, run_id="g-a"),
                    Exit("j", 0, "n0", 101.5, exit_code=1, run_id="g-a"))
    assert [d.action for d in decs] == ["restart"] and st is not None
    m1 = Match("connection-error", "retryable", False, 111.0, "ConnectionError", 0)
    st, decs = feed(st, start("g-b", attempt=1, ts=110.0, source="generated"),
                    Hit("j", 1, "n0", m1, run_id="g-b"),
                    Exit("j", 1, "n0", 111.5, exit_code=1, run_id="g-b"))
    assert st is not None and st.run_id == "g-a" and st.attempt == 1
    assert [(d.action, d.budgets["restarts_used"]) for d in decs] == [("restart", 2)]
    # a new submission of the name starts at attempt 0: a fresh run (positive control)
    st2, _ = feed(st, start("g-c", attempt=0, ts=300.0, source="generated"))
    assert st2 is not None and st2.run_id == "g-c" and st2.restarts_used == 0
