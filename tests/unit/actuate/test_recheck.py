"""Held, queued and replayed actions meet each node's latest registry record before they run
(issue 35 item 2), a fresh actuate acts on latest records only, and a requeue never runs
for a drain the scheduler refused (item 7)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from faultwatch.actuate.journal import Journal
from faultwatch.actuate.limits import ActuateLimits
from faultwatch.actuate.plan import QUARANTINE, RELEASE, REQUEUE, Action
from faultwatch.actuate.recheck import stale
from faultwatch.actuate.runner import ActuateConfig, Actuator, hold_file, release_file
from faultwatch.core.events import Decision
from faultwatch.core.registry import NodeRecord, Reason, RegistryPolicy, quarantine, release

POL = RegistryPolicy()


def quarantined(node: str, at: float, did: str = "") -> NodeRecord:
    return quarantine(None, node, at, Reason(ts=at, event="quarantine",
                                             decision=did or f"d-{node}", rule="r"), POL)


def released(rec: NodeRecord, at: float) -> NodeRecord:
    return release(rec, rec.node, at, Reason(ts=at, event="release",
                                             decision=f"manual-{int(at)}", rule="manual"))


def test_stale_compares_the_action_with_the_nodes_latest_record() -> None:
    q = quarantined("n1", 100.0)
    drain = Action(QUARANTINE, "n1", "d1", ts=100.0)
    assert stale(drain, {}, 200.0) is None  # no record: nothing overtook it
    assert stale(drain, {"n1": q}, 200.0) is None  # still quarantined
    assert "healthy" in (stale(drain, {"n1": released(q, 150.0)}, 200.0) or "")
    assert "over" in (stale(drain, {"n1": q}, q.until or 0) or "")  # expired
    # a record older than the action overtakes nothing (the decision came first)
    assert stale(Action(QUARANTINE, "n1", "d2", ts=160.0), {"n1": released(q, 150.0)},
                 200.0) is None
    assert stale(Action(REQUEUE, "n1", "d1", ts=100.0), {"n1": released(q, 150.0)},
                 200.0) is not None
    resume = Action(RELEASE, "n1", "manual-150", ts=150.0)
    assert stale(resume, {"n1": released(q, 150.0)}, 200.0) is None
    again = quarantined("n1", 170.0)
    assert "quarantined again" in (stale(resume, {"n1": again}, 200.0) or "")


class Drains:
    name = "recorder"

    def __init__(self) -> None:
        self.calls: list[str] = []

    def apply(self, a: Action) -> str:
        self.calls.append(f"{a.kind} {a.node}")
        return "ok"


def actuator(tmp: Path, backend: Any = None, **cfg: Any) -> Actuator:
    c = ActuateConfig(bootstrap="-", prefix="t.", state_file=tmp / "s.jsonl", group="g",
                      retry_s=0.0, fleet_nodes=1000,
                      limits=ActuateLimits(max_drains_per_window=5), **cfg)
    return Actuator(backend or Drains(), Journal(c.state_file), c)


def test_releasing_held_nodes_drops_their_drains_and_release_hold_runs_only_the_rest(
        tmp_path: Path) -> None:
    act = actuator(tmp_path)
    b: Drains = act.backend  # type: ignore[assignment]
    recs = [quarantined(f"n{i:02d}", 100.0) for i in range(20)]
    for r in recs:
        act.on_node(r, 100.0)
    act.run_due(100.0)
    assert len(b.calls) == 5 and len(act.held_nodes()) == 15  # the limits hold the rest
    for r in recs[5:18]:  # the operator releases 13 of the 15 held nodes
        act.on_node(released(r, 120.0), 120.0)
    assert act.held_nodes() == ["n18", "n19"]
    assert hold_file(act.cfg.state_file).exists()
    release_file(act.cfg.state_file).touch()  # faultwatch actuate --release-hold
    assert act.check_release(130.0) == 2
    act.run_due(130.0)
    drained = [c for c in b.calls if c.startswith("quarantine")]
    assert drained == [f"quarantine n{i:02d}" for i in (*range(5), 18, 19)]
    # released nodes may be resumed (their latest record says so), never drained
    assert not any(c == f"quarantine n{i:02d}" for i in range(5, 18) for c in b.calls)


def test_a_hold_whose_every_node_was_released_ends(tmp_path: Path) -> None:
    act = actuator(tmp_path)
    recs = [quarantined(f"n{i}", 100.0) for i in range(7)]
    for r in recs:
        act.on_node(r, 100.0)
    act.run_due(100.0)
    assert act.held_nodes() == ["n5", "n6"]
    for r in recs[5:]:
        act.on_node(released(r, 110.0), 110.0)
    assert act.held == {} and act.held_since is None
    assert not hold_file(act.cfg.state_file).exists()


def test_a_fresh_actuate_acts_on_each_nodes_latest_record_not_its_history(
        tmp_path: Path) -> None:
    act = actuator(tmp_path)
    b: Drains = act.backend  # type: ignore[assignment]
    x1 = quarantined("x", 10.0)
    x2 = released(x1, 20.0)
    x3 = quarantine(x2, "x", 30.0, Reason(ts=30.0, event="quarantine", decision="d-x2",
                                          rule="r"), POL)
    x4 = released(x3, 40.0)
    y1 = quarantined("y", 10.0)
    y2 = released(y1, 20.0)
    y3 = quarantine(y2, "y", 30.0, Reason(ts=30.0, event="quarantine", decision="d-y2",
                                          rule="r"), POL)
    for rec in (x1, y1, x2, y2, x3, y3, x4):  # the topic, read at start (no planning)
        act.on_node(rec, 50.0, plan=False)
    act.plan_registry(50.0)
    act.run_due(50.0)
    assert b.calls == ["release x", "quarantine y"]
    assert [r.seq for r in (x1, x2, x3, x4)] == [1, 2, 3, 4]  # each change is a version


class RefusingExec:
    """The exec backend's shape: a confirm template that says no, requeue recorded."""

    name = "exec"

    def __init__(self, answer: int) -> None:
        self.calls: list[str] = []
        self.answer = answer
        self.timeout_s = 5.0
        self.templates = {"confirm": ("confirm", "{job}", "{node}")}

    def _run(self, argv: list[str], **kw: Any) -> Any:
        import subprocess

        if self.answer < 0:
            raise subprocess.TimeoutExpired(argv, 5.0)
        return subprocess.CompletedProcess(argv, self.answer, "", "")

    def apply(self, a: Action) -> str:
        self.calls.append(f"{a.kind} {a.node}")
        return "ok"


def blacklist(did: str, node: str, ts: float) -> Decision:
    return Decision(id=did, job="train", attempt=0, action="blacklist", kind="error", ts=ts,
                    nodes=(node,), rule="xid-79", run_id="r1",
                    scheduler={"kind": "slurm", "job_id": "7"})


def test_no_requeue_after_its_drain_was_refused_not_allocated(tmp_path: Path) -> None:
    no = RefusingExec(answer=1)  # the scheduler: the job does not run there
    act = actuator(tmp_path, no)
    act.on_decision(blacklist("d1", "n1", 100.0), 100.0, "t[0]@0")
    act.run_due(100.0)
    assert no.calls == []
    assert not act.queue and not act.queued
    yes = RefusingExec(answer=0)  # positive control: confirmed, drained then requeued
    act2 = actuator(tmp_path / "2", yes)
    act2.on_decision(blacklist("d2", "n2", 100.0), 100.0, "t[0]@0")
    act2.run_due(100.0)
    assert yes.calls == ["quarantine n2", "requeue n2"]


def test_a_requeue_waits_while_its_drain_is_retried(tmp_path: Path) -> None:
    flaky = RefusingExec(answer=-1)  # the scheduler cannot be asked: retried
    act = actuator(tmp_path, flaky)
    act.on_decision(blacklist("d1", "n1", 100.0), 100.0, "t[0]@0")
    act.run_due(100.0)
    assert flaky.calls == []
    flaky.answer = 1  # then it answers: not there
    act.run_due(101.0)
    assert flaky.calls == [] and not act.queued


def test_queued_and_replayed_drains_meet_the_latest_record_first(tmp_path: Path) -> None:
    """A drain begun before a crash (the journal replays it) and one queued in the same batch
    as the node's release are dropped, not run; a node still quarantined is drained."""
    j = Journal(tmp_path / "s.jsonl")
    j.begin(Action(QUARANTINE, "gone", "d-gone", ts=100.0))
    j.begin(Action(QUARANTINE, "bad", "d-bad", ts=100.0))
    j.close()
    act = actuator(tmp_path)
    b: Drains = act.backend  # type: ignore[assignment]
    q = quarantined("gone", 100.0, "d-gone")
    act.on_node(released(q, 110.0), 110.0, plan=False)
    act.on_node(quarantined("bad", 100.0, "d-bad"), 110.0, plan=False)
    act.on_node(quarantined("late", 100.0), 110.0)  # queued, then released in the batch
    act.on_node(released(quarantined("late", 100.0), 111.0), 111.0, plan=False)
    act.run_due(112.0)
    assert b.calls == ["quarantine bad"]
    assert set(Journal(tmp_path / "s.jsonl").pending) == set()  # dropped: not pending again
