"""Issue 35 item 1: a node speaks only about runs it is in. A made-up run id never joins a
named run; where the scheduler's allocation is known, a node outside it is refused whatever
run id it claims, cannot spend the run's restart budget and is never among the nodes a
decision restarts (core/runs.py, core/membership.py)."""

from __future__ import annotations

from faultwatch.core.events import Exit, Heartbeat, Hit, Match, RunStart, Signal
from faultwatch.core.job import JobState, Phase
from faultwatch.core.membership import allocation_key
from faultwatch.core.policy import Policy
from tests.support import job_events as td

P = Policy(settle_s=2, max_restarts=4, node_lost_s=60)
SLURM = {"kind": "slurm", "job_id": "77"}
XID = Match("nvidia-xid-hardware", "hardware", False, 0.0, "NVRM: Xid 79", None)
NEVER = frozenset[str]()


def feed(st: JobState | None, *sigs: Signal, answers: dict[str, frozenset[str]] | None = None
         ) -> tuple[JobState, list]:
    out, decs = td.feed(st, *sigs, policy=P, answers=answers)
    assert out is not None
    return out, decs


def start(node: str, run: str, source: str, ts: float = 100.0, attempt: int = 0,
          scheduler: dict[str, object] | None = None) -> RunStart:
    return RunStart("victim", attempt, node, ts, run_id=run, run_source=source,
                    scheduler=scheduler or {})


def xid_and_exit(node: str, run: str, ts: float, attempt: int = 0) -> list[Signal]:
    m = Match(XID.rule, XID.category, False, ts, XID.line, None)
    return [Hit("victim", attempt, node, m, run_id=run),
            Exit("victim", attempt, node, ts + 0.5, exit_code=1, run_id=run)]


def victim() -> JobState:
    """VICTIM runs on nodeB under Slurm (run id = the Slurm job id), heart-beating."""
    st, _ = feed(None, start("nodeB", "77", "slurm", scheduler=SLURM),
                 Heartbeat("victim", 0, "nodeB", 101.0, True, 101.0, run_id="77"))
    return st


def test_a_generated_run_id_never_joins_a_scheduler_named_run() -> None:
    """The issue's attack: nodeA's agent starts `--job VICTIM` with a generated id and prints
    an Xid line. Before: it joined run 77, the blacklist of nodeA restarted nodeB too, and
    four such runs exhausted VICTIM's budget (fail, exit 78)."""
    st = victim()
    for attempt in range(4):
        st, decs = feed(st, start("nodeA", f"g-{attempt}", "generated", 110.0 + attempt,
                                  attempt=attempt),
                        *xid_and_exit("nodeA", f"g-{attempt}", 110.2 + attempt, attempt))
        assert decs == []
    assert set(st.nodes) == {"nodeB"} and st.run_ids == {"77"}
    assert st.restarts_used == 0 and st.phase == Phase.RUNNING
    assert st.dropped["other-run"] == 4 and st.dropped["unknown-run"] == 8
    # positive control: nodeB's own Xid is decided, restarting only the run's node
    st, decs = feed(st, *xid_and_exit("nodeB", "77", 120.0),
                    Heartbeat("victim", 0, "nodeB", 125.0, True, 120.0, run_id="77"))
    assert [(d.action, d.nodes, d.evidence["restart_nodes"]) for d in decs] == [
        ("blacklist", ("nodeB",), ["nodeB"])]


def test_weak_ids_still_join_a_weak_run() -> None:
    """Multi-node jobs without a shared id keep working: generated and derived ids join
    each other while the run is active (and the decision lists every joined id)."""
    st, _ = feed(None, start("n0", "rdzv-1", "rendezvous"), start("n1", "g-2", "generated"))
    assert st.run_ids == {"rdzv-1", "g-2"} and set(st.nodes) == {"n0", "n1"}


def test_a_node_outside_the_allocation_is_refused_whatever_run_id_it_claims() -> None:
    """With the scheduler's answer (slurm:77 holds nodeB only), nodeA claiming run 77
    itself (--run-id 77, or SLURM_JOB_ID=77 in its environment) is refused: no node, no
    decision, no budget spent."""
    answers = {"slurm:77": frozenset({"nodeB"})}
    st, _ = feed(None, start("nodeB", "77", "slurm", scheduler=SLURM), answers=answers)
    assert st.allocation == {"nodeB"}
    for claim in (start("nodeA", "77", "flag", 110.0),
                  start("nodeA", "77", "slurm", 110.0, scheduler=SLURM)):
        st, decs = feed(st, claim, *xid_and_exit("nodeA", "77", 110.2), answers=answers)
        assert decs == [] and set(st.nodes) == {"nodeB"}
    assert st.dropped["not-allocated"] == 6 and st.restarts_used == 0
    # the answer is kept in the state: without the shell's answers (a restarted processor)
    # the allocation still holds
    st, decs = feed(st, *xid_and_exit("nodeA", "77", 111.0))
    assert decs == [] and st.dropped["not-allocated"] == 8
    # positive control: a node of the allocation is decided
    st, decs = feed(st, *xid_and_exit("nodeB", "77", 112.0))
    assert [(d.action, d.nodes) for d in decs] == [("blacklist", ("nodeB",))]


def test_the_allocation_is_refreshed_by_a_run_start_of_the_same_scheduler_job() -> None:
    """A Slurm requeue of job 77 lands on nodeC: its run-start refreshes the allocation."""
    st, _ = feed(None, start("nodeB", "77", "slurm", scheduler=SLURM),
                 answers={"slurm:77": frozenset({"nodeB"})})
    st, _ = feed(st, start("nodeC", "77", "slurm", 200.0, attempt=1, scheduler=SLURM),
                 answers={"slurm:77": frozenset({"nodeC"})})
    assert st.allocation == {"nodeC"} and "nodeC" in st.nodes


def test_a_run_the_scheduler_runs_elsewhere_is_not_taken_over_by_another_node() -> None:
    """nodeA runs its own Slurm job 99 (allocation {nodeA}) and names it VICTIM: while the
    scheduler still runs 77 on nodeB, VICTIM's run is not replaced (before: the new run
    retired 77 and every record of the victim was refused). Once 77 holds no nodes, a new
    run of the name starts (positive control)."""
    answers = {"slurm:77": frozenset({"nodeB"}), "slurm:99": frozenset({"nodeA"})}
    st, _ = feed(None, start("nodeB", "77", "slurm", scheduler=SLURM), answers=answers)
    other = start("nodeA", "99", "slurm", 110.0, scheduler={"kind": "slurm", "job_id": "99"})
    st, _ = feed(st, other, answers=answers)
    assert st.run_id == "77" and st.dropped["name-in-use"] == 1
    st, _ = feed(st, other, answers={**answers, "slurm:77": NEVER})
    assert st.run_id == "99" and st.retired == ("77",) and st.allocation == {"nodeA"}


def test_a_derived_id_launched_again_is_a_new_run_with_other_decision_ids() -> None:
    """The same rendezvous endpoint launched twice derives one id: the second launch (after
    the first is over) is a fresh run whose decisions have other ids, so consumers that
    remember the first run's ids do not take them for replays."""
    st, decs1 = feed(None, start("n0", "rdzv-x", "rendezvous"), *xid_and_exit("n0", "rdzv-x",
                                                                            101.0))
    assert [d.action for d in decs1] == ["blacklist"] and st.run_gen == 0
    st, _ = feed(st, start("n0", "rdzv-x", "rendezvous", 200.0, attempt=1))
    assert st.run_gen == 0 and st.attempt == 1  # the relaunch continues the run
    st, _ = feed(st, Exit("victim", 1, "n0", 210.0, 0, run_id="rdzv-x"))
    assert st.phase == Phase.DONE
    # the first launch's own records sent again (a replay) start no run and decide nothing
    st, again = feed(st, start("n0", "rdzv-x", "rendezvous"), *xid_and_exit("n0", "rdzv-x",
                                                                           101.0))
    assert again == [] and st.run_gen == 0 and st.phase == Phase.DONE
    st, decs2 = feed(st, start("n0", "rdzv-x", "rendezvous", 300.0),
                     *xid_and_exit("n0", "rdzv-x", 301.0))
    assert st.run_gen == 1 and st.run_id == "rdzv-x" and st.restarts_used == 1
    assert [d.action for d in decs2] == ["blacklist"] and decs2[0].id != decs1[0].id


def test_allocation_keys() -> None:
    assert allocation_key({"kind": "slurm", "job_id": "7"}) == "slurm:7"
    assert allocation_key({"kind": "kubernetes", "namespace": "ml", "uid": "u1",
                           "pod": "p"}) == "kubernetes:ml/u1"
    assert allocation_key({"kind": "kubernetes", "namespace": "ml", "pod": "p"}) == \
        "kubernetes:ml/pod/p"
    assert allocation_key({"labels": {"a": "b"}}) is None
