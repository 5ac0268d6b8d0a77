"""Real Slurm end to end: a hardware fault on n1 drains n1 and the job finishes on n2.

A slurmctld and two slurmd (n1, n2) run on this machine (tests/support/slurm.py). An sbatch
job (--requeue; the batch script is Python, exec'ing `faultwatch agent` with an argv list)
prints an NVIDIA Xid 79 line only on n1. `faultwatch process` decides a hardware blacklist,
`faultwatch actuate --backend slurm` drains n1 with faultwatch's reason and requeues the job,
which finishes on n2. `faultwatch nodes` shows n1 quarantined; `faultwatch nodes release n1`
resumes it. Every wait is on a condition (sinfo / scontrol show / the topics).
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from faultwatch.errors import ConfigError
from tests.support.cluster import wait_decisions
from tests.support.processes import job_env, stop_group
from tests.support.slurm import SlurmCluster, missing
from tests.support.waiting import wait_until

pytestmark = [pytest.mark.slow, pytest.mark.kafka]

FW = [sys.executable, "-m", "faultwatch"]  # the one entry point, no console script needed
XID_LINE = "NVRM: Xid (PCI:0000:3b:00): 79, pid={pid}, GPU has fallen off the bus."

TRAIN = f'''\
import os, sys, time
XID_LINE = {XID_LINE!r}
node = os.environ.get("SLURMD_NODENAME", "?")
print(f"training on {{node}} restart={{os.environ.get('SLURM_RESTART_COUNT', '0')}}",
      flush=True)
if node == "n1":
    print(XID_LINE.format(pid=os.getpid()), flush=True)
    time.sleep(300)  # the GPU is gone: the job hangs until it is moved
    sys.exit(1)
print(f"finished on {{node}}", flush=True)
'''

BATCH = '''\
#!{python}
import os
node = os.environ["SLURMD_NODENAME"]
env = dict(os.environ, FAULTWATCH_ATTEMPT=os.environ.get("SLURM_RESTART_COUNT", "0"))
argv = [{python!r}, "-m", "faultwatch", "agent", "--job", {job!r}, "--node", node,
        "--heartbeat-s", "1", "--", {python!r}, "-u", {train!r}]
os.execve(argv[0], argv, env)
'''


@pytest.fixture(scope="session")
def slurm() -> Iterator[SlurmCluster]:
    why = missing()
    if why:
        pytest.fail(why)  # a missing Slurm is a broken test install, not a reason to skip
    cluster = SlurmCluster()
    try:
        cluster.start()
        yield cluster
    finally:
        cluster.stop()


def _fw(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*FW, *args], capture_output=True, text=True,
                          timeout=60, env=env)


def _start_actuate(env: dict[str, str], log: Path, state: Path, group: str
                   ) -> subprocess.Popen[bytes]:
    before = log.read_text().count("actuate_started") if log.exists() else 0
    with open(log, "ab") as out:
        proc = subprocess.Popen([*FW, "actuate", "--backend", "slurm",
                                 "--state-file", str(state), "--group", group],
                                stdout=out, stderr=subprocess.STDOUT, env=env,
                                start_new_session=True)
    wait_until(lambda: log.read_text().count("actuate_started") > before, 60, "actuate started",
               interval_s=0.3, detail=log.read_text)
    assert proc.poll() is None, log.read_text()
    return proc


@contextmanager
def _processor(bootstrap: str, prefix: str, log: Path) -> Iterator[subprocess.Popen[bytes]]:
    """A `faultwatch process` worker (2 partitions), stopped at the end."""
    with open(log, "wb") as out:
        proc = subprocess.Popen([*FW, "process", "--bootstrap", bootstrap, "--topic-prefix",
                                 prefix, "--partitions", "2"], stdout=out,
                                stderr=subprocess.STDOUT, env=job_env(),
                                start_new_session=True)
    try:
        yield proc
    finally:
        stop_group(proc)


def test_slurm_backend_drains_resumes_and_leaves_foreign_drains_alone(
        slurm: SlurmCluster) -> None:
    from faultwatch.actuate.plan import QUARANTINE, RELEASE, Action
    from faultwatch.actuate.slurm import SlurmBackend

    b = SlurmBackend(env=slurm.env())
    assert b.apply(Action(QUARANTINE, "n2", "d0a1", "nvidia-xid-hardware")) == "drained n2"
    assert slurm.node_info("n2")["Reason"].startswith("faultwatch d0a1: nvidia-xid-hardware")
    assert "drain" in slurm.node_states()["n2"]
    assert b.apply(Action(RELEASE, "n2", "m1")) == "resumed n2"
    wait_until(lambda: slurm.node_states().get("n2") == "idle", 30, "n2 idle", interval_s=0.3)
    # an admin's drain is not ours to undo (positive control above: ours is resumed)
    slurm.run("scontrol", "update", "nodename=n2", "state=drain", "reason=admin: bad fan")
    try:
        assert "left alone" in b.apply(Action(RELEASE, "n2", "m2"))
        assert "drain" in slurm.node_states()["n2"]
    finally:
        slurm.run("scontrol", "update", "nodename=n2", "state=resume")
    wait_until(lambda: slurm.node_states().get("n2") == "idle", 30, "n2 idle", interval_s=0.3)


def test_actuate_drains_a_node_for_a_job_only_where_slurm_runs_it(slurm: SlurmCluster) -> None:
    """Issue 28: before a drain for a job, actuate asks Slurm whether the job runs on the node
    (its NodeList by job id, else squeue by name on the node); a blacklist of a node the job
    does not run on is refused (not_allocated, counted) and the node stays up."""
    from faultwatch.actuate.confirm import confirm
    from faultwatch.actuate.plan import QUARANTINE, Action
    from faultwatch.actuate.slurm import SlurmBackend

    b = SlurmBackend(env=slurm.env())
    name = f"confirm-{uuid.uuid4().hex[:6]}"
    jid = slurm.run("sbatch", "--parsable", "-w", "n1", f"--job-name={name}",
                    "--output=/dev/null", "--wrap", "sleep 300").stdout.strip().split(";")[0]
    try:
        wait_until(lambda: slurm.job_info(jid).get("JobState") == "RUNNING", 60,
                   "the job running on n1", interval_s=0.3)

        def q(node: str, **sched: str) -> Action:
            return Action(QUARANTINE, node, "d1", "nvidia-xid-79", name, dict(sched))

        assert confirm(b, q("n1", kind="slurm", job_id=jid)) is None  # positive controls
        assert confirm(b, q("n1")) is None
        assert confirm(b, q("n2", kind="slurm", job_id=jid)) == \
            f"Slurm job {jid} ({name}) does not run on n2 (its nodes: n1)"
        assert confirm(b, q("n2")) == f"Slurm runs no job named {name!r} on n2"
    finally:
        slurm.run("scancel", jid, check=False)


def test_the_processor_asks_slurm_which_nodes_a_job_holds(slurm: SlurmCluster) -> None:
    """Issue 35 item 1: `process --allocation-check slurm` asks slurmctld for a job's
    nodes: a running job holds its NodeList, an ended or unknown one holds none."""
    from faultwatch.streams.allocations import slurm_asker

    ask = slurm_asker(env=slurm.env())
    jid = slurm.run("sbatch", "--parsable", "-w", "n1", "--job-name=alloc-check",
                    "--output=/dev/null", "--wrap", "sleep 300").stdout.strip().split(";")[0]
    try:
        wait_until(lambda: slurm.job_info(jid).get("JobState") == "RUNNING", 60,
                   "the job running on n1", interval_s=0.3)
        assert ask(f"slurm:{jid}") == {"n1"}
    finally:
        slurm.run("scancel", jid, check=False)
    wait_until(lambda: slurm.job_info(jid).get("JobState") not in ("RUNNING", "COMPLETING"),
               60, "the job to end", interval_s=0.3)
    assert ask(f"slurm:{jid}") == frozenset()
    assert ask("slurm:987654321") == frozenset()  # never a job: no node


def test_xid79_on_n1_drains_n1_and_the_job_finishes_on_n2(
        slurm: SlurmCluster, kafka_bootstrap: str, tmp_path: Path) -> None:
    prefix = f"fwslurm-{uuid.uuid4().hex[:8]}."
    job = f"slurm-e2e-{uuid.uuid4().hex[:6]}"
    env = slurm.env(job_env())
    env.update(FAULTWATCH_BOOTSTRAP=kafka_bootstrap, FAULTWATCH_TOPIC_PREFIX=prefix,
               FAULTWATCH_SPOOL_DIR=str(tmp_path / "spool"))
    train = tmp_path / "train.py"
    train.write_text(TRAIN)
    batch = tmp_path / "job.py"
    batch.write_text(BATCH.format(python=sys.executable, job=job,
                                  train=str(train)))
    batch.chmod(0o755)
    out_file = tmp_path / "slurm-out.txt"
    state = tmp_path / "actuate.jsonl"
    act_log = tmp_path / "actuate.log"
    group = f"{prefix}actuate"

    def diag() -> str:
        return (f"--- actuate\n{act_log.read_text()[-3000:]}\n--- job output\n"
                f"{out_file.read_text()[-3000:] if out_file.exists() else ''}\n"
                f"{slurm.logs_tail(10)}")

    with _processor(kafka_bootstrap, prefix, tmp_path / "processor.log"):
        actuate = _start_actuate(env, act_log, state, group)
        try:
            r = subprocess.run([slurm_exe("sbatch"), "--parsable", "--requeue",
                                f"--job-name={job}", "--open-mode=append",
                                f"--output={out_file}", str(batch)],
                               env=env, capture_output=True, text=True, timeout=30)
            assert r.returncode == 0, r.stderr
            jid = r.stdout.strip().split(";")[0]
            wait_until(lambda: slurm.job_info(jid).get("NodeList") == "n1", 60,
                       "the job running on n1 first", interval_s=0.3, detail=diag)

            decs = wait_until(lambda: [d for d in wait_decisions(kafka_bootstrap, prefix, job,
                                                                 timeout_s=5)
                                       if d["action"] == "blacklist"], 120,
                              "a blacklist decision", interval_s=0.3, detail=diag)
            dec = decs[0]
            assert dec["targets"]["nodes"] == ["n1"]
            assert dec["reason"]["category"] == "hardware"  # whichever built-in rule named it
            # the agent's run-start carried Slurm's identity; the actuator requeues by job id
            assert dec["scheduler"]["kind"] == "slurm"
            assert dec["scheduler"]["job_id"] == jid and dec["scheduler"]["node"] == "n1"
            rule = dec["reason"]["rule"]
            want_reason = f"faultwatch {dec['id']}: {rule}"

            wait_until(lambda: "drain" in slurm.node_states().get("n1", ""), 60,
                       "n1 drained", interval_s=0.3, detail=diag)
            assert slurm.node_info("n1")["Reason"].startswith(want_reason)

            info = wait_until(lambda: (lambda j: j if j.get("JobState") == "COMPLETED" else None)(
                slurm.job_info(jid)), 180, "the job completed", interval_s=0.3, detail=diag)
            assert info["NodeList"] == "n2"
            assert int(info["Restarts"]) >= 1
            text = out_file.read_text()
            assert "training on n1 restart=0" in text and "finished on n2" in text
            assert "drain" not in slurm.node_states()["n2"]

            nodes = [json.loads(x) for x in _fw(env, "nodes", "--json").stdout.splitlines()]
            n1 = next(n for n in nodes if n["node"] == "n1")
            assert n1["state"] == "quarantined" and n1["strikes"] == 1
            assert n1["until"] > time.time()
            assert n1["reasons"][-1]["decision"] == dec["id"]
            assert n1["reasons"][-1]["rule"] == rule
            assert "fallen off the bus" in (n1["reasons"][-1]["line"] or "")
            assert not any(n["node"] == "n2" for n in nodes)

            # crash and restart the actuator: the journal keeps it from acting twice
            stop_group(actuate, signal.SIGKILL)
            restarts = info["Restarts"]
            actuate = _start_actuate(env, act_log, state, group)
            done = [json.loads(x) for x in state.read_text().splitlines()]
            keys = [d["key"] for d in done if d["phase"] == "done"]
            assert len(keys) == len(set(keys)), keys
            assert f"requeue:n1:{dec['id']}" in keys
            assert "requeued (was" in act_log.read_text()
            assert "[job id from the decision]" in act_log.read_text()

            rel = _fw(env, "nodes", "release", "n1")
            assert rel.returncode == 0, rel.stderr
            # positive control: actuate is live
            wait_until(lambda: slurm.node_states().get("n1") == "idle", 60,
                       "n1 resumed after release", interval_s=0.3, detail=diag)
            assert slurm.job_info(jid)["Restarts"] == restarts
            assert slurm.job_info(jid)["JobState"] == "COMPLETED"
            nodes = [json.loads(x) for x in _fw(env, "nodes", "--json").stdout.splitlines()]
            assert next(n for n in nodes if n["node"] == "n1")["state"] == "healthy"
        finally:
            stop_group(actuate)
            slurm.run("scontrol", "update", "nodename=n1", "state=resume", check=False)


def slurm_exe(name: str) -> str:
    import shutil

    return shutil.which(name) or name


def test_manual_quarantine_drains_and_release_resumes(
        slurm: SlurmCluster, kafka_bootstrap: str, tmp_path: Path) -> None:
    prefix = f"fwslurm-{uuid.uuid4().hex[:8]}."
    env = slurm.env(job_env())
    env.update(FAULTWATCH_BOOTSTRAP=kafka_bootstrap, FAULTWATCH_TOPIC_PREFIX=prefix)
    log = tmp_path / "actuate.log"
    bad = _fw(env, "nodes", "quarantine", "n2;scontrol", "--for", "1h", "--reason", "x")
    assert bad.returncode == ConfigError.exit_code and "node: invalid value" in bad.stderr
    actuate = _start_actuate(env, log, tmp_path / "state.jsonl", f"{prefix}actuate")
    try:
        q = _fw(env, "nodes", "quarantine", "n2", "--for", "1h", "--reason", "fan failing")
        assert q.returncode == 0, q.stderr
        rec = json.loads(q.stdout)
        assert rec["state"] == "quarantined" and 3590 < rec["until"] - time.time() <= 3600
        wait_until(lambda: "drain" in slurm.node_states().get("n2", ""), 60, "n2 drained",
                   interval_s=0.3, detail=log.read_text)
        reason = slurm.node_info("n2")["Reason"]
        assert reason.startswith(f"faultwatch {rec['reasons'][-1]['decision']}: manual")
        listed = _fw(env, "nodes").stdout
        assert "n2" in listed and "quarantined" in listed and "fan failing" in listed
        assert _fw(env, "nodes", "release", "n2").returncode == 0
        wait_until(lambda: slurm.node_states().get("n2") == "idle", 60, "n2 resumed",
                   interval_s=0.3, detail=log.read_text)
    finally:
        stop_group(actuate)
        slurm.run("scontrol", "update", "nodename=n2", "state=resume", check=False)


# Names the real slurmctld reads as other or more nodes than the one named when a command
# says `nodename=NAME` (each probed below with a harmless comment update first): every node
# (any case of `all`), a range, lists, a NodeSet (`gpus`, tests/support/slurm.py) and a
# NodeHostname (`localhost`: n1's and n2's; Slurm picks n1).
SLURM_READS_AS_OTHERS = ("ALL", "all", "n[1-2]", "n1,n2", "n1 n2", "gpus", "localhost")


def test_names_slurm_reads_as_other_nodes_are_refused(slurm: SlurmCluster) -> None:
    from faultwatch.actuate.backend import ActuateError
    from faultwatch.actuate.plan import QUARANTINE, RELEASE, Action
    from faultwatch.actuate.slurm import SlurmBackend

    def touched(name: str) -> list[str]:
        """The nodes a `scontrol update nodename=NAME` reaches (a comment, then cleared)."""
        mark = f"probe-{uuid.uuid4().hex[:6]}"
        slurm.run("scontrol", "update", f"nodename={name}", f"comment={mark}", check=False)
        rows = slurm.run("scontrol", "show", "node", "-o").stdout.splitlines()
        slurm.run("scontrol", "update", "nodename=n1,n2", "comment=")
        return sorted(r.split()[0].removeprefix("NodeName=") for r in rows
                      if f"Comment={mark}" in r)

    b = SlurmBackend(env=slurm.env())
    before = slurm.node_states()
    for node in ("n1", "n2"):  # positive controls: a node's own name is that node
        assert touched(node) == [node]
        assert b.one_node(node)["NodeName"] == node
    try:
        for name in SLURM_READS_AS_OTHERS:
            reached = touched(name)
            assert reached and reached != [name], (name, reached)  # Slurm's reading
            with pytest.raises((ConfigError, ActuateError)) as refused:
                b.apply(Action(QUARANTINE, name, "d0b1", "nvidia-xid-hardware"))
            if isinstance(refused.value, ActuateError):
                assert refused.value.permanent, name
            with pytest.raises((ConfigError, ActuateError)):
                b.apply(Action(RELEASE, name, "d0b2"))
        assert slurm.node_states() == before
        assert not any(slurm.node_info(n).get("Reason", "").startswith("faultwatch d0b1")
                       for n in ("n1", "n2"))
    finally:
        for node in ("n1", "n2"):
            if slurm.node_info(node).get("Reason", "").startswith("faultwatch d0b1"):
                slurm.run("scontrol", "update", f"nodename={node}", "state=resume")


# ---- the exit-code contract with Slurm's own RequeueExit (docs/schedulers.md#exit-codes) --

CONTRACT_BATCH = '''\
#!{python}
import os
restart = os.environ.get("SLURM_RESTART_COUNT", "0")
env = dict(os.environ, FAULTWATCH_ATTEMPT=restart)
argv = [{python!r}, "-m", "faultwatch", "agent", "--job", {job!r},
        "--node", os.environ["SLURMD_NODENAME"], "--heartbeat-s", "1",
        "--follow-decisions", "--decision-wait-s", "2", "--exit-flush-timeout-s", "5",
        "--verdict-out", {verdicts!r} + f"/{{restart}}.json", *{flags!r},
        "--", {python!r}, "-c", {child!r}]
os.execve(argv[0], argv, env)
'''


@pytest.fixture(scope="module")
def slurm_requeue_exit() -> Iterator[SlurmCluster]:
    """A cluster of its own whose slurm.conf says `RequeueExit=75,138` (the session cluster
    has the actuator requeue instead; both at once would race)."""
    why = missing()
    if why:
        pytest.fail(why)
    cluster = SlurmCluster(extra_conf=("RequeueExit=75,138",))
    try:
        cluster.start()
        yield cluster
    finally:
        cluster.stop()


def test_requeue_exit_requeues_run_me_elsewhere_never_a_childs_own_138(
        slurm_requeue_exit: SlurmCluster, kafka_bootstrap: str, tmp_path: Path) -> None:
    """Issue 21's collision, under Slurm itself: with `RequeueExit=75,138` a job whose agent
    exits 138 (a failed boot check with --bootcheck-abort: this node is bad) is requeued by
    slurmctld and completes; a job whose command exits 138 by itself (no decision arrives:
    no processor runs) ends FAILED with the agent's 77, never requeued."""
    slurm = slurm_requeue_exit
    prefix = f"fwreq-{uuid.uuid4().hex[:8]}."  # nobody processes it: no decision comes
    env = slurm.env(job_env())
    env.update(FAULTWATCH_BOOTSTRAP=kafka_bootstrap, FAULTWATCH_TOPIC_PREFIX=prefix,
               FAULTWATCH_SPOOL_DIR=str(tmp_path / "spool"))
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    jobs = {  # the first launch's boot check fails (its path is missing); the requeued passes
        "elsewhere": (["--bootcheck", "--bootcheck-abort", "--no-bootcheck-allreduce",
                       "--bootcheck-path", str(scratch / "missing")], "print('trained')"),
        "own138": ([], "import sys; print('trained'); sys.exit(138)"),
    }
    ids: dict[str, str] = {}
    for what, (flags, child) in jobs.items():
        verdicts = tmp_path / what
        verdicts.mkdir()
        batch = tmp_path / f"{what}.py"
        text = CONTRACT_BATCH.format(python=sys.executable, job=f"{what}-{uuid.uuid4().hex[:6]}",
                                     verdicts=str(verdicts), flags=flags, child=child)
        if what == "elsewhere":  # the requeued launch checks a path that exists
            text = text.replace("os.execve(", f"argv = [{str(scratch)!r} if a == "
                                f"{str(scratch / 'missing')!r} and restart != '0' else a "
                                "for a in argv]\nos.execve(")
        batch.write_text(text)
        batch.chmod(0o755)
        r = subprocess.run([slurm_exe("sbatch"), "--parsable", "--requeue", f"--job-name={what}",
                            "--open-mode=append", f"--output={tmp_path / what}.out", str(batch)],
                           env=env, capture_output=True, text=True, timeout=30)
        assert r.returncode == 0, r.stderr
        ids[what] = r.stdout.strip().split(";")[0]

    def ended(jid: str, requeued_ends: bool = False) -> dict[str, str] | None:
        info = slurm.job_info(jid)
        if requeued_ends and int(info.get("Restarts") or 0) > 0:
            return info  # requeued: that is the answer already
        return info if info.get("JobState") in ("COMPLETED", "FAILED") else None

    def diag() -> str:
        outs = "".join(f"--- {p.name}\n{p.read_text()[-2000:]}\n"
                       for p in tmp_path.glob("*.out"))
        return outs + slurm.logs_tail(10)

    # positive control: Slurm requeued the agent's 138 itself, and the relaunch completed
    info = wait_until(lambda: ended(ids["elsewhere"]), 180, "the 138 job to end",
                      interval_s=0.5, detail=diag)
    assert (info["JobState"], int(info["Restarts"])) == ("COMPLETED", 1), (info, diag())
    first = json.loads((tmp_path / "elsewhere" / "0.json").read_text())
    assert (first["verdict"], first["exit_code"]) == ("elsewhere", 138), first
    assert first["child"]["exit_code"] is None  # the command never ran on the bad node
    assert json.loads((tmp_path / "elsewhere" / "1.json").read_text())["exit_code"] == 0
    # the command's own 138 is reported, not passed through: 77, FAILED, not requeued
    info = wait_until(lambda: ended(ids["own138"], True), 120, "the child's-138 job to end",
                      interval_s=0.5, detail=diag)
    assert (info["JobState"], info["ExitCode"], int(info["Restarts"])) == \
        ("FAILED", "77:0", 0), (info, diag())
    own = json.loads((tmp_path / "own138" / "0.json").read_text())
    assert (own["verdict"], own["child"]["exit_code"]) == ("undecided", 138), own
    assert not (tmp_path / "own138" / "1.json").exists()
