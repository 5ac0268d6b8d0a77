"""Actuator planning (strict field validation), exec argv templates, the journal and replay."""

from __future__ import annotations

import dataclasses
import sys
from pathlib import Path
from typing import Any

import pytest

from faultwatch.actuate.exec import ExecBackend, fill, parse_template
from faultwatch.actuate.journal import Journal
from faultwatch.actuate.plan import QUARANTINE, RELEASE, REQUEUE, Action, plan_decision, plan_node
from faultwatch.actuate.runner import ActuateConfig, Actuator
from faultwatch.actuate.slurm import SlurmBackend, drain_reason, parse_show
from faultwatch.core.events import Decision
from faultwatch.core.registry import Reason, RegistryPolicy, quarantine, release
from faultwatch.errors import ConfigError
from faultwatch.wire import decision_of


def _dec(**over: Any) -> Decision:
    return decision_of(_raw(**over))


def _raw(**over: Any) -> dict[str, Any]:
    d: dict[str, Any] = {"v": 1, "id": "0f1e2d3c4b5a69788796", "job": "train", "attempt": 0,
                         "action": "blacklist", "ts": 100.0,
                         "targets": {"nodes": ["n1"], "ranks": []}, "run_id": "42",
                         "reason": {"kind": "error", "rule": "nvidia-xid-hardware",
                                    "category": "hardware", "message": "m"},
                         "evidence": {"first_error": {"line": "NVRM: Xid 79"}}, "budgets": {},
                         "rules_version": "", "scheduler": {"kind": "slurm", "job_id": "42",
                                                            "node": "n1"}}
    d.update(over)
    return d


def test_blacklist_plans_quarantine_then_requeue_with_identity() -> None:
    acts = plan_decision(_dec())
    assert [(a.kind, a.node) for a in acts] == [(QUARANTINE, "n1"), (REQUEUE, "n1")]
    assert acts[1].scheduler == {"kind": "slurm", "job_id": "42", "node": "n1"}
    assert plan_decision(_dec(action="restart")) == []
    assert drain_reason(acts[0]) == "faultwatch 0f1e2d3c4b5a69788796: nvidia-xid-hardware"


def test_a_node_a_hot_spare_replaced_is_drained_and_the_job_not_requeued() -> None:
    acts = plan_decision(_dec(swaps=[{"node": "n1", "spare": "n3"}]))
    assert [(a.kind, a.node) for a in acts] == [(QUARANTINE, "n1")]
    # two bad nodes, one swapped (a decision a processor never makes: all or none): the
    # other is still requeued away from
    two = _dec(targets={"nodes": ["n1", "n2"], "ranks": []},
               swaps=[{"node": "n1", "spare": "n3"}])
    assert [(a.kind, a.node) for a in plan_decision(two)] == [
        (QUARANTINE, "n1"), (QUARANTINE, "n2"), (REQUEUE, "n2")]


@pytest.mark.parametrize("over", [
    {"targets": {"nodes": ["n1; scontrol shutdown"], "ranks": []}},
    {"targets": {"nodes": ["-n1"], "ranks": []}},
    {"targets": {"nodes": [], "ranks": []}},
    {"id": "abc def"},
    {"id": "x" * 200},
    {"reason": {"kind": "error", "rule": "rule with space"}},
    {"scheduler": {"kind": "slurm", "job_id": "42 43"}},
    {"scheduler": {"kind": "slurm", "job_id": "--all"}},
    {"scheduler": {"kind": "kubernetes", "namespace": "ML_NS"}},
    {"scheduler": {"kind": "kubernetes", "namespace": "ml", "pod": "../../nodes/x"}},
    {"targets": {"nodes": ["ALL"], "ranks": []}},  # Slurm reads `all` as every node
    {"targets": {"nodes": ["n[1-99]"], "ranks": []}},
    {"targets": {"nodes": ["n1,n2"], "ranks": []}},
])
def test_every_field_used_is_validated(over: dict[str, Any]) -> None:
    with pytest.raises(ConfigError):
        plan_decision(_dec(**over))


def test_node_records_plan_quarantine_release_and_expiry() -> None:
    pol = RegistryPolicy(quarantine_s=10.0)
    r = Reason(ts=0.0, event="quarantine", decision="d1", rule="nvidia-xid-hardware")
    rec = quarantine(None, "n1", 0.0, r, pol)
    assert plan_node(rec, 1.0) == [Action(QUARANTINE, "n1", "d1", "nvidia-xid-hardware")]
    assert plan_node(rec, 10.0) == [Action(RELEASE, "n1", "expire-10")]
    rel = release(rec, "n1", 2.0, Reason(ts=2.0, event="release", decision="manual-1"))
    assert plan_node(rel, 3.0) == [Action(RELEASE, "n1", "manual-1")]


def test_exec_templates_fill_whole_arguments_and_reject_unknown_fields() -> None:
    tpl = parse_template("--exec-quarantine", '["/bin/drain", "--node={node}", "{decision}"]')
    assert tpl is not None
    a = Action(QUARANTINE, "n1", "d1", "r")
    assert fill(tpl, a) == ["/bin/drain", "--node=n1", "d1"]
    assert fill(("/bin/x", "{job_id}"), a) is None  # needs a field the action lacks
    for bad in ('["/bin/x", "{nodes}"]', '"/bin/x {node}"', "[]", '["{node}"]', "nope"):
        with pytest.raises(ConfigError):
            parse_template("--exec-quarantine", bad)


def test_exec_backend_runs_argv_without_a_shell(tmp_path: Path) -> None:
    out = tmp_path / "out.txt"
    prog = ("import sys; open(sys.argv[1], 'a').write(' '.join(sys.argv[2:]) + '\\n')")
    b = ExecBackend({QUARANTINE: (sys.executable, "-c", prog, str(out), "{node}",
                                  "{decision}")})
    b.apply(Action(QUARANTINE, "n1", "d1", "r"))
    assert out.read_text() == "n1 d1\n"
    assert "no --exec-release" in b.apply(Action(RELEASE, "n1", "d2"))


class Recorder:
    name = "recorder"

    def __init__(self, fail: int = 0) -> None:
        self.calls: list[str] = []
        self.fail = fail

    def apply(self, a: Action) -> str:
        from faultwatch.actuate.backend import ActuateError

        self.calls.append(a.key)
        if self.fail:
            self.fail -= 1
            raise ActuateError("scheduler said no")
        return "ok"


def _cfg(tmp_path: Path) -> ActuateConfig:
    return ActuateConfig(bootstrap="-", prefix="t.", state_file=tmp_path / "s.jsonl",
                         group="g", retry_s=0.0)


def test_dedupe_by_decision_id_across_restarts(tmp_path: Path) -> None:
    # by default the job stage writes the registry, the actuator only reads it
    assert Actuator(Recorder(), Journal(tmp_path / "ro.jsonl"), _cfg(tmp_path)).on_decision(
        _dec(), 100.0, "t[0]@0") == []
    cfg = dataclasses.replace(_cfg(tmp_path), write_registry=True)  # --registry-writer
    rec = Recorder()
    act = Actuator(rec, Journal(cfg.state_file), cfg)
    ups = act.on_decision(_dec(), 100.0, "t[0]@0")
    assert [u.node for u in ups] == ["n1"] and ups[0].state == "quarantined"
    act.on_decision(_dec(), 100.0, "t[0]@1")  # the same decision published twice
    assert act.run_due(100.0) == 2
    assert len(rec.calls) == 2
    act.journal.close()
    # a new process with the same state file: the decision again does nothing
    rec2 = Recorder()
    act2 = Actuator(rec2, Journal(cfg.state_file), cfg)
    act2.on_decision(_dec(), 100.0, "t[0]@0")
    act2.on_node(ups[0], 101.0)  # the registry record of the same decision
    assert act2.run_due(101.0) == 0 and rec2.calls == []


def test_action_begun_but_not_done_is_replayed_after_a_crash(tmp_path: Path) -> None:
    cfg = _cfg(tmp_path)
    j = Journal(cfg.state_file)
    a = plan_decision(_dec())[0]
    j.begin(a)  # crash here: the scheduler may or may not have acted
    j.close()
    with open(cfg.state_file, "ab") as fh:
        fh.write(b'{"key": "torn')  # a torn last line
    rec = Recorder()
    act = Actuator(rec, Journal(cfg.state_file), cfg)
    assert act.run_due(0.0) == 1 and rec.calls == [a.key]


def test_failed_action_is_retried_then_given_up(tmp_path: Path) -> None:
    cfg = _cfg(tmp_path)
    rec = Recorder(fail=1)
    act = Actuator(rec, Journal(cfg.state_file), cfg)
    act.on_decision(_dec(), 100.0, "x")
    act.run_due(100.0)
    act.run_due(100.0)
    assert rec.calls.count(plan_decision(_dec())[0].key) == 2  # failed once, then done
    rec_all = Recorder(fail=99)
    act2 = Actuator(rec_all, Journal(tmp_path / "other.jsonl"), cfg)
    act2.on_decision(_dec(id="aaaa"), 100.0, "x")
    for _ in range(12):
        act2.run_due(100.0)
    assert len(rec_all.calls) == 2 * cfg.max_tries


def test_old_decisions_are_ignored(tmp_path: Path) -> None:
    cfg = _cfg(tmp_path)
    act = Actuator(Recorder(), Journal(cfg.state_file), cfg)
    assert act.on_decision(_dec(ts=0.0), 10_000.0, "x") == []
    assert not act.queue


def test_slurm_requeue_only_while_the_job_holds_the_node() -> None:
    import subprocess

    jobs = {"42": "JobId=42 JobName=train JobState=RUNNING NodeList=n1 BatchHost=n1",
            "43": "JobId=43 JobName=train JobState=PENDING NodeList=(null)",
            "44": "JobId=44 JobName=train JobState=RUNNING NodeList=n2"}
    calls: list[list[str]] = []

    def runner(argv: list[str], **kw: Any) -> subprocess.CompletedProcess[str]:
        calls.append(argv)
        out = ""
        if argv[1:3] == ["show", "job"]:
            out = jobs[argv[3]]
        elif argv[1:3] == ["show", "hostnames"]:
            out = argv[3].replace(",", "\n")
        return subprocess.CompletedProcess(argv, 0, out, "")

    b = SlurmBackend(runner=runner)
    for jid, want in (("42", "requeued"), ("43", "already pending"), ("44", "no longer on")):
        a = Action(REQUEUE, "n1", "d", "r", "train", {"kind": "slurm", "job_id": jid})
        assert want in b.apply(a)
    assert [c for c in calls if c[1] == "requeue"] == [["scontrol", "requeue", "42"]]
    info = parse_show("NodeName=n1 State=IDLE+DRAIN Reason=faultwatch d1: rule-x "
                      "[root@2026-01-01T00:00:00] Comment=(null)")
    assert info["Reason"] == "faultwatch d1: rule-x [root@2026-01-01T00:00:00]"


def test_slurm_without_identity_finds_the_job_by_name_on_that_node_only() -> None:
    import subprocess

    calls: list[list[str]] = []

    def runner(argv: list[str], **kw: Any) -> subprocess.CompletedProcess[str]:
        calls.append(argv)
        out = {"squeue": "77 train\n78 train,other\n",
               "show": "JobId=77 JobState=FAILED NodeList=n1"}.get(
            argv[0] if argv[0] == "squeue" else argv[1], "")
        if argv[1:3] == ["show", "hostnames"]:
            out = "n1\n"
        if argv[1:3] == ["show", "node"]:
            out = f"NodeName={argv[3]} State=IDLE Reason=(null)\n"
        return subprocess.CompletedProcess(argv, 0, out, "")

    b = SlurmBackend(runner=runner)
    assert "77: requeued (was failed on n1)" in b.apply(Action(REQUEUE, "n1", "d", "r", "train"))
    assert calls[0] == ["squeue", "-h", "-t", "all", "-w", "n1", "--name=train", "-o",
                        "%i %j"]  # 78 is another job's name: not requeued
    assert calls[-1] == ["scontrol", "requeue", "77"]
    assert b.apply(Action(QUARANTINE, "n1", "d", "r")) == "drained n1"
    assert calls[-1] == ["scontrol", "update", "nodename=n1", "state=drain",
                         "reason=faultwatch d: r"]


def test_deploy_manifests_parse() -> None:
    import yaml

    root = Path(__file__).resolve().parents[3] / "deploy" / "kubernetes"
    kinds = [d["kind"] for f in (root / "actuate-rbac.yaml", root / "actuate-deployment.yaml")
             for d in yaml.safe_load_all(f.read_text()) if d]
    assert {"ClusterRole", "ClusterRoleBinding", "ServiceAccount", "Deployment"} <= set(kinds)


@pytest.mark.parametrize("job", ["x y", "a;b", "-leading", "train"])
def test_job_names_the_agent_accepts_are_planned(job: str) -> None:
    acts = plan_decision(_dec(job=job))
    assert {a.job for a in acts} == {job}


@pytest.mark.parametrize(("show", "code", "permanent"), [
    ("Node gpus not found\n", 1, True),  # a NodeSet (or a host name): not a node's name
    ("NodeName=n1 State=IDLE\nNodeName=n2 State=IDLE\n", 0, True),  # read as two nodes
    ("", 1, False),  # slurmctld unreachable: retried
])
def test_slurm_drains_only_a_name_slurmctld_reads_as_that_one_node(
        show: str, code: int, permanent: bool) -> None:
    import subprocess

    from faultwatch.actuate.backend import ActuateError

    calls: list[list[str]] = []

    def runner(argv: list[str], **kw: Any) -> subprocess.CompletedProcess[str]:
        calls.append(argv)
        if argv[1:3] == ["show", "node"] and argv[3] == "n1":  # positive control
            return subprocess.CompletedProcess(argv, 0, "NodeName=n1 State=IDLE\n", "")
        if argv[1:3] == ["show", "node"]:
            err = "" if show else "slurm_load_node error: Unable to contact slurm controller"
            return subprocess.CompletedProcess(argv, code, show, err)
        return subprocess.CompletedProcess(argv, 0, "", "")

    b = SlurmBackend(runner=runner)
    assert b.apply(Action(QUARANTINE, "n1", "d", "r")) == "drained n1"
    with pytest.raises(ActuateError) as e:
        b.apply(Action(QUARANTINE, "gpus", "d", "r"))
    assert e.value.permanent is permanent
    assert not any(c[1] == "update" and c[2] == "nodename=gpus" for c in calls)
