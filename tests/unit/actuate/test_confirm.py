"""actuate asks the scheduler before it drains or taints a node for a job."""

from __future__ import annotations

import subprocess
from typing import Any

import pytest

from faultwatch.actuate.backend import ActuateError
from faultwatch.actuate.confirm import confirm
from faultwatch.actuate.exec import ExecBackend
from faultwatch.actuate.plan import QUARANTINE, REQUEUE, Action, plan_decision, plan_node
from faultwatch.actuate.slurm import SlurmBackend
from faultwatch.core.events import Decision
from faultwatch.core.registry import NodeRecord
from faultwatch.core.registry import Reason as NodeReason


class FakeSlurm:
    """scontrol/squeue answers: job 77 runs on gpu-[01-02]; job `train` on gpu-01 only."""

    def __init__(self) -> None:
        self.calls: list[list[str]] = []

    def __call__(self, argv: list[str], **kw: Any) -> subprocess.CompletedProcess[str]:
        self.calls.append(argv)
        out = ""
        if argv[1:3] == ["show", "job"]:
            out = "JobId=77 JobName=train JobState=RUNNING NodeList=gpu-[01-02]" \
                if argv[3] == "77" else ""
        elif argv[1:3] == ["show", "hostnames"]:
            out = "gpu-01\ngpu-02\n" if argv[3] == "gpu-[01-02]" else ""
        elif argv[0] == "squeue":
            node = argv[argv.index("-w") + 1]
            name = next(a.split("=", 1)[1] for a in argv if a.startswith("--name="))
            out = "77\n" if (node, name) == ("gpu-01", "train") else ""
        return subprocess.CompletedProcess(argv, 0, out, "")


def q(node: str, job: str = "train", **sched: str) -> Action:
    return Action(QUARANTINE, node, "d1", "xid", job, dict(sched))


def test_slurm_confirms_by_the_jobs_node_list_and_refuses_other_nodes() -> None:
    b = SlurmBackend(runner=FakeSlurm())
    assert confirm(b, q("gpu-02", kind="slurm", job_id="77")) is None
    why = confirm(b, q("gpu-07", kind="slurm", job_id="77"))
    assert why is not None and "does not run on gpu-07" in why and "gpu-01,gpu-02" in why
    assert "gpu-07" in (confirm(b, q("gpu-07", kind="slurm", job_id="99")) or "")


def test_slurm_without_a_job_id_asks_squeue_by_name_on_the_node() -> None:
    b = SlurmBackend(runner=FakeSlurm())
    assert confirm(b, q("gpu-01")) is None
    assert "no job named 'train' on gpu-02" in (confirm(b, q("gpu-02")) or "")


def test_no_job_behind_a_quarantine_needs_no_confirmation() -> None:
    fake = FakeSlurm()
    b = SlurmBackend(runner=fake)
    assert confirm(b, q("gpu-09", job="")) is None  # an operator's quarantine
    assert confirm(b, Action(REQUEUE, "gpu-09", "d1", "x", "train")) is None
    assert fake.calls == []


def test_exec_confirm_template_yes_no_and_error() -> None:
    def runner(code: int) -> Any:
        return lambda argv, **kw: subprocess.CompletedProcess(argv, code, "", "boom")

    tpl = ("/bin/is-on", "{job}", "{node}")
    for code, want in ((0, None), (1, "does not run on gpu-01")):
        b = ExecBackend({QUARANTINE: ("/bin/drain", "{node}"), "confirm": tpl},
                        runner=runner(code))
        got = confirm(b, q("gpu-01"))
        assert got is None if want is None else want in (got or "")
    b = ExecBackend({QUARANTINE: ("/bin/drain", "{node}"), "confirm": tpl}, runner=runner(2))
    with pytest.raises(ActuateError):
        confirm(b, q("gpu-01"))
    unchecked = ExecBackend({QUARANTINE: ("/bin/drain", "{node}")}, runner=runner(1))
    assert confirm(unchecked, q("gpu-01")) is None  # no template: logged once, not confirmed


def test_quarantines_carry_the_job_and_identity_to_confirm() -> None:
    dec = Decision(id="d1", job="train", attempt=0, action="blacklist", kind="error", ts=1.0,
                   nodes=("gpu-01",), rule="xid", scheduler={"kind": "slurm", "job_id": "77"})
    qa = [a for a in plan_decision(dec) if a.kind == QUARANTINE][0]
    assert qa.job == "train" and qa.scheduler["job_id"] == "77"
    rec = NodeRecord(node="gpu-01", state="quarantined", until=None, strikes=1, reasons=(
        NodeReason(ts=1.0, event="quarantine", decision="d1", rule="xid", job="train"),))
    assert plan_node(rec, 2.0)[0].job == "train"
    manual = NodeRecord(node="gpu-01", state="quarantined", until=None, strikes=1, reasons=(
        NodeReason(ts=1.0, event="quarantine", decision="manual-abc", rule="manual",
                   job="alice"),))
    assert plan_node(manual, 2.0)[0].job == ""  # an operator's: no job to confirm


class FakeKube:
    """The Kubernetes backend's API as confirm reads it: pod ml/train-0 runs on gpu-01."""

    name = "kubernetes"
    pod_selector = None

    def __init__(self) -> None:
        self.applied: list[tuple[str, str]] = []

    def _request(self, method: str, path: str, ok404: bool = False) -> Any:
        return {"spec": {"nodeName": "gpu-01"}} if path.endswith("/pods/train-0") else None

    def apply(self, a: Action) -> str:
        self.applied.append((a.kind, a.node))
        return "ok"


@pytest.mark.parametrize("order", ["registry_queued_first", "registry_refused_first",
                                   "decision_first"])
def test_a_blacklist_is_confirmed_whichever_of_its_records_actuate_reads_first(
        order: str, tmp_path: Any) -> None:
    """The processor writes a blacklist twice: the decision (with the run's scheduler
    identity) and the registry record (the job's name only). Read in either order, the node
    is drained when the pod runs there; the registry's unidentified action never blocks the
    decision's (before: the registry record first left the node undrained)."""
    import time

    from faultwatch.actuate.journal import Journal
    from faultwatch.actuate.runner import ActuateConfig, Actuator
    from faultwatch.core.registry import RegistryPolicy, registry_updates

    now = time.time()

    def run(node: str) -> FakeKube:
        b = FakeKube()
        d = tmp_path / f"{order}-{node}"
        act = Actuator(b, Journal(d), ActuateConfig("x:1", "p.", d, "g", fleet_nodes=100))
        dec = Decision(id=f"d-{node}", job="train", attempt=0, action="blacklist",
                       kind="error", ts=now, nodes=(node,), rule="xid", run_id="r1",
                       scheduler={"kind": "kubernetes", "namespace": "ml", "pod": "train-0"})
        recs = registry_updates(dec, {}, now, RegistryPolicy())
        if order == "decision_first":
            act.on_decision(dec, now, "decisions[0]@1")
        for r in recs:
            act.on_node(r, now)
        if order == "registry_refused_first":
            act.run_due(now)  # refused: no identity to confirm it with
        if order != "decision_first":
            act.on_decision(dec, now, "decisions[0]@1")
        act.run_due(now)
        return b

    assert ("quarantine", "gpu-01") in run("gpu-01").applied
    assert ("quarantine", "gpu-07") not in run("gpu-07").applied  # the pod is not there
