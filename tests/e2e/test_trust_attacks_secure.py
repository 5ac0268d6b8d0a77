"""Issue 35's rows of the consumer × attack table (tests/e2e/test_trust_attacks.py holds issue
28's), on a locked-down broker set up as docs/operating.md says (`kafka up --secure`: SASL_SSL,
one principal and client file per role, the role ACLs; Ed25519 keys, one trust file):

1. a node's key cannot join, restart or spend a job it does not run (made-up run ids, claimed
   run ids; the processor asks the scheduler, an exec stand-in, which nodes a job holds);
3. one node's key neither fills the job table nor trips the blast-radius guard;
4. a node's own old records sent again, and a new app id reading the logs topic from its
   start, publish no old decision again;
6. the hold: after a storm of signed quarantines the operator releases most held nodes;
   `--release-hold` drains only those the registry still quarantines; a fresh actuate (a new
   state file) acts on each node's latest record, never on its history;
7. actuate on a prefix whose nodes topic is missing and not authorised: calm (no spin, one line
   per state change), a prompt exit on SIGTERM, and it starts once `kafka acls --apply` (as
   the admin role, on its first run) made the topics;
8. deploy/ as shipped (tests/support/deploy.py runs its manifests and units with their paths
   mapped): an agent-principal client with no key claiming node B does not make actuate drain
   B, forged decisions are refused by notify, actuate and the agents; the node's own agent is
   acted on (positive control);
9. smaller: no requeue after a drain refused as not_allocated; a signed quarantine replayed
   seconds after its release is refused (versions, not clocks) and `faultwatch nodes` shows it
   and a forged record as refused; so is a rule set replayed seconds after the next push, by
   the shipped processor; `notify --webhook` refuses a Mattermost hooks/ URL; the broker's
   data directory is its owner's alone.

FAULTWATCH_TRUST_TESTS_CODE=/path/to/an/old/tree runs the faultwatch processes from that tree
(as in test_trust_attacks.py): that is how each case was seen to fail on the code before."""

from __future__ import annotations

import http.server
import os
import socketserver
import stat
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson
import pytest

from faultwatch.core.registry import NodeRecord, Reason, RegistryPolicy, quarantine, release
from faultwatch.registry.writer import encode_signed
from faultwatch.trust.keys import read_signing_key
from faultwatch.trust.records import NODE_RECORD, RecordSigner
from faultwatch.wire import node_key
from tests.support import deploy
from tests.support.cluster import events, wait_event
from tests.support.processes import cpu_s, faultwatch_exe, log_lines, stop_group
from tests.support.secure_site import SecureSite
from tests.support.waiting import wait_until

pytestmark = [pytest.mark.slow, pytest.mark.kafka]

CODE = {"PYTHONPATH": os.environ["FAULTWATCH_TRUST_TESTS_CODE"]} \
    if os.environ.get("FAULTWATCH_TRUST_TESTS_CODE") else {}
RECORD = "import sys\nopen(sys.argv[1], 'a').write(' '.join(sys.argv[2:]) + '\\n')\n"
# the scheduler stand-in: exit 0 when job argv[2] runs on node argv[3] per the allocation file
CONFIRM = ("import sys\nalloc = dict(l.split() for l in open(sys.argv[1]) if l.strip())\n"
           "sys.exit(0 if sys.argv[3] in alloc.get(sys.argv[2], '').split(',') else 1)\n")
K8S_NODES = ("node-a", "node-b")
SLURM_NODES = ("n1", "n2")
ISSUE35_NODES = ("GOODNODE", "BADNODE", "CTRLNODE", "NODE4", "NODE5", "NODE7")


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SecureSite]:
    s = SecureSite.start(tmp_path_factory.mktemp("secure"),
                         (*K8S_NODES, *SLURM_NODES, *ISSUE35_NODES), partitions=12, code=CODE)
    try:
        yield s
    finally:
        s.stop()


def read(p: Path) -> list[str]:
    return p.read_text().splitlines() if p.exists() else []


class Actuate:
    """`faultwatch actuate --backend exec` as the actuator role with the trust file: drains,
    releases and requeues recorded in files, the scheduler asked through --exec-confirm."""

    def __init__(self, site: SecureSite, prefix: str, tmp: Path, *flags: str,
                 alloc: dict[str, str] | None = None, state: str = "state.jsonl") -> None:
        tmp.mkdir(parents=True, exist_ok=True)
        self.tmp, self.state = tmp, tmp / state
        (tmp / "alloc").write_text("".join(f"{j} {n}\n" for j, n in (alloc or {}).items()))
        self.log = tmp / f"actuate-{state}.log"

        def rec(kind: str) -> str:
            return orjson.dumps([sys.executable, "-c", RECORD, str(tmp / kind), "{node}",
                                 "{decision}"]).decode()

        confirm = orjson.dumps([sys.executable, "-c", CONFIRM, str(tmp / "alloc"), "{job}",
                                "{node}"]).decode()
        with open(self.log, "wb") as fh:
            self.proc = subprocess.Popen(
                [faultwatch_exe(), "actuate", "--backend", "exec",
                 "--exec-quarantine", rec("drained"), "--exec-release", rec("released"),
                 "--exec-requeue", rec("requeued"), "--exec-confirm", confirm,
                 "--state-file", str(self.state), "--metrics-port", "0", *flags],
                stdout=fh, stderr=subprocess.STDOUT,
                env=site.env("actuator", prefix, **CODE), start_new_session=True)

    def started(self, timeout_s: float = 90.0) -> Actuate:
        wait_event(self.log, "actuate_started", timeout_s, proc=self.proc)
        return self

    def nodes(self, kind: str) -> list[str]:
        return [ln.split()[0] for ln in read(self.tmp / kind)]

    def stop(self) -> None:
        stop_group(self.proc)


def signed_records(key: Path, records: list[NodeRecord]) -> list[tuple[bytes, bytes | None]]:
    signer = RecordSigner(read_signing_key(key), NODE_RECORD)
    return [(node_key(r.node), encode_signed(r, signer)) for r in records]


def q(node: str, at: float, did: str = "") -> NodeRecord:
    """A quarantine with no job behind it (nothing for the scheduler to confirm)."""
    return quarantine(None, node, at, Reason(ts=at, event="quarantine",
                                             decision=did or f"d-{node}-{int(at)}",
                                             rule="nvidia-xid-79"), RegistryPolicy())


def freed(rec: NodeRecord, at: float) -> NodeRecord:
    return release(rec, rec.node, at, Reason(ts=at, event="release",
                                             decision=f"manual-{uuid.uuid4().hex[:12]}",
                                             rule="manual", line="back in service"))


def new_prefix(site: SecureSite, name: str) -> str:
    """A fresh prefix, its topics and ACLs made by the admin role's first `kafka acls
    --apply` (this tree's; case 7 runs the tree under test's)."""
    prefix = f"{name}{uuid.uuid4().hex[:6]}."
    res = site.new_prefix(prefix)
    assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-2000:]
    assert {f"{prefix}nodes", f"{prefix}decisions", f"{prefix}logs"} <= site.topics()
    return prefix


# ---- case 6: the hold and a fresh state file -------------------------------------------------

def test_case6_release_hold_drains_only_what_the_registry_still_quarantines(
        site: SecureSite, tmp_path: Path) -> None:
    prefix = new_prefix(site, "hold")
    act = Actuate(site, prefix, tmp_path, "--fleet-nodes", "1000").started()
    try:
        now = time.time()
        storm = [q(f"gpu-{i:02d}", now) for i in range(20)]
        site.produce("processor", f"{prefix}nodes", signed_records(site.key("proc"), storm))
        wait_event(act.log, "actuate_hold", 60, proc=act.proc)
        wait_until(lambda: len(act.nodes("drained")) >= 5, 60, "the first five drains")
        hold_file = act.state.with_name("state.jsonl.hold")
        held = wait_until(lambda: orjson.loads(hold_file.read_bytes())["nodes"], 60,
                          "15 held", until=lambda h: len(h) == 15)
        # the operator looks at the cause and releases 13 of the 15 held nodes: one with the
        # CLI, the others with the records it writes (signed with the operator's key)
        keep, free = held[-2:], held[:-2]
        res = subprocess.run([faultwatch_exe(), "nodes", "release", free[0], "--reason",
                              "false alarm"], env=site.env("admin", prefix,
                                                           FAULTWATCH_SIGNING_KEY_FILE=str(
                                                               site.key("ops"))),
                             capture_output=True, text=True, timeout=60)
        assert res.returncode == 0, res.stderr
        by_node = {r.node: r for r in storm}
        site.produce("admin", f"{prefix}nodes", signed_records(
            site.key("ops"), [freed(by_node[n], time.time()) for n in free[1:]]))
        dropped = wait_until(lambda: sum(int(e["actions"]) for e in events(
            act.log, "actuate_hold_dropped")), 30, "the released nodes' drains to leave the "
            "hold", until=lambda n: n >= 13, raise_on_timeout=False)
        hold = orjson.loads(hold_file.read_bytes())
        rel = subprocess.run([faultwatch_exe(), "actuate", "--backend", "exec",
                              "--state-file", str(act.state), "--release-hold"],
                             env=site.env("actuator", prefix, **CODE), capture_output=True,
                             text=True, timeout=60)
        assert rel.returncode == 0, rel.stderr
        wait_until(lambda: len(act.nodes("drained")) >= 7, 60, "the two still quarantined")
        wait_event(act.log, "actuate_hold_released", 30, proc=act.proc)
        time.sleep(2)  # a few more ticks: nothing else may follow
        drained = act.nodes("drained")
        assert not set(free) & set(drained), f"released nodes drained: {drained}"
        assert sorted(drained[5:]) == sorted(keep), drained
        assert dropped >= 13 and sorted(hold["nodes"]) == sorted(keep), hold
    finally:
        act.stop()


def test_case6_a_fresh_actuate_acts_on_each_nodes_latest_record(site: SecureSite,
                                                                tmp_path: Path) -> None:
    """x: quarantined, released, quarantined, released; y: quarantined, released,
    quarantined. A new state file: y drained once, x resumed (its latest word), x never
    drained. Before: drain x, resume x, drain x, resume x, drain y, resume y, drain y."""
    prefix = new_prefix(site, "fresh")
    t = time.time() - 60
    x1, y1 = q("x", t), q("y", t)
    x2, y2 = freed(x1, t + 10), freed(y1, t + 10)
    x3, y3 = quarantine(x2, "x", t + 20, Reason(ts=t + 20, event="quarantine", decision="d-x2",
                                                 rule="r"), RegistryPolicy()), \
        quarantine(y2, "y", t + 20, Reason(ts=t + 20, event="quarantine", decision="d-y2",
                                           rule="r"), RegistryPolicy())
    x4 = freed(x3, t + 30)
    proc = [r for r in (x1, y1, x3, y3)]
    ops = [r for r in (x2, y2, x4)]
    for r in sorted(proc + ops, key=lambda r: r.updated_ts):  # the topic's history, in order
        key = site.key("proc") if r in proc else site.key("ops")
        site.produce("processor" if r in proc else "admin", f"{prefix}nodes",
                     signed_records(key, [r]))
    act = Actuate(site, prefix, tmp_path).started()
    try:
        wait_until(lambda: act.nodes("drained") and act.nodes("released"), 60,
                   "y drained and x resumed")
        time.sleep(2)
        assert act.nodes("drained") == ["y"] and act.nodes("released") == ["x"]
    finally:
        act.stop()


# ---- case 7: a missing, unauthorised nodes topic ---------------------------------------------

def test_case7_actuate_waits_calmly_for_its_topics_and_stops_on_sigterm(
        site: SecureSite, tmp_path: Path) -> None:
    prefix = f"late{uuid.uuid4().hex[:6]}."  # no topics, no ACLs yet
    act = Actuate(site, prefix, tmp_path)
    try:
        wait_event(act.log, "actuate_waiting_for_topic", 60, proc=act.proc)
        lines, cpu = log_lines(act.log), cpu_s(act.proc.pid)
        time.sleep(8)  # what it does while it waits
        assert log_lines(act.log) - lines <= 1, act.log.read_text()[-2000:]
        assert cpu_s(act.proc.pid) - cpu < 1.0  # was ~0.44 of a core: 3.5 s in 8 s
        # the admin makes the topics and ACLs (its first run does): actuate goes on by itself
        new = site.new_prefix(prefix, code=True)
        assert new.returncode == 0, new.stderr
        assert {f"{prefix}nodes", f"{prefix}decisions"} <= site.topics()
        wait_event(act.log, "actuate_topic_ready", 60, proc=act.proc)
        wait_event(act.log, "actuate_started", 60, proc=act.proc)
        waits = events(act.log, "actuate_waiting_for_topic")
        assert len(waits) == 1 and waits[0]["reason"] == "missing_or_not_authorized", waits
    finally:
        act.stop()
    # SIGTERM while it waits: a second actuate on another new prefix
    act2 = Actuate(site, f"never{uuid.uuid4().hex[:6]}.", tmp_path / "2")
    wait_event(act2.log, "actuate_waiting_for_topic", 60, proc=act2.proc)
    t0 = time.monotonic()
    act2.proc.terminate()
    act2.proc.wait(30)
    assert time.monotonic() - t0 < 8.0 and act2.proc.returncode == 0


# ---- case 8: deploy/ as shipped -----------------------------------------------------------

XID = "NVRM: Xid (PCI:0000:3b:00): 79, pid=4242, GPU has fallen off the bus."
FOREVER = "import time\nprint('training', flush=True)\nwhile True: time.sleep(0.1)\n"
CRASH = ["sh", "-c", f"echo training; sleep 1; echo '{XID}' >&2; exit 1"]


class Hook(http.server.BaseHTTPRequestHandler):
    posted: list[bytes] = []

    def do_POST(self) -> None:  # noqa: N802
        Hook.posted.append(self.rfile.read(int(self.headers.get("Content-Length", 0))))
        self.send_response(200)
        self.end_headers()

    def log_message(self, *a: Any) -> None:
        pass


@pytest.fixture(scope="module")
def webhook() -> Iterator[str]:
    srv = socketserver.TCPServer(("127.0.0.1", 0), Hook)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{srv.server_address[1]}/hook"
    finally:
        srv.shutdown()


def kubelet(site: SecureSite, root: Path, webhook: str, node: str = "") -> deploy.Kubelet:
    """What the pods of deploy/kubernetes mount, made from the site: the Secrets the
    manifests' headers say to create (the client files `kafka up --secure` wrote), the trust
    ConfigMap, and on a node that node's own key."""
    secrets = {f"faultwatch-{role}-kafka": site.client_files(role)
               for role in ("processor", "actuator", "agent")}
    secrets["faultwatch-processor-kafka"]["username"] = b"faultwatch-processor"
    secrets["faultwatch-processor-key"] = {"processor.key": site.key("proc").read_bytes()}
    secrets["faultwatch-webhooks"] = {"webhooks": f"{webhook}\n".encode()}
    return deploy.Kubelet(root / (node or "service"), secrets,
                          {"faultwatch-trust": {"trust": site.trust.read_text()}},
                          {"/etc/faultwatch/node.key": site.key(node)} if node else {})


def start(launch: deploy.Launch, site: SecureSite, log: Path, *extra: str,
          env: dict[str, str] | None = None) -> subprocess.Popen[bytes]:
    """A shipped process: its environment only (none of the test's FAULTWATCH_*), the
    secure broker as its bootstrap, a home of its own (a container's filesystem: the
    agent's default spool lives there)."""
    home = log.with_name(log.stem + "-home")
    home.mkdir(exist_ok=True)
    base = {k: v for k, v in os.environ.items() if not k.startswith("FAULTWATCH_")}
    full = {**base, **launch.env, "FAULTWATCH_BOOTSTRAP": site.bootstrap, "HOME": str(home),
            "PYTHONUNBUFFERED": "1", **(env or {}), **CODE}
    with open(log, "wb") as fh:
        return subprocess.Popen([faultwatch_exe(), *launch.argv, *extra], stdout=fh,
                                stderr=subprocess.STDOUT, env=full, start_new_session=True)


@pytest.fixture(scope="module")
def shipped_processor(site: SecureSite, webhook: str,
                      tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """The processor Deployment of deploy/kubernetes/processor.yaml (its unit for Slurm
    resolves to the same role, key and trust: test_deploy_files.py)."""
    root = tmp_path_factory.mktemp("pods")
    launch = kubelet(site, root, webhook).launch("processor.yaml", "processor", {},
                                                 workload="faultwatch-processor").free_ports()
    log = root / "processor.log"
    proc = start(launch, site, log)
    try:
        wait_until(lambda: proc.poll() is None and site.group_stable("faultwatch.processor"),
                   180, "the shipped processor to join its group", interval_s=1.0)
        yield log
    finally:
        stop_group(proc)


def k8s_fields(node: str, pod: str, job: str, uid: str) -> dict[str, str]:
    return {"spec.nodeName": node, "metadata.name": pod, "metadata.namespace": "ml",
            "metadata.labels['job-name']": job,
            "metadata.labels['training.kubeflow.org/job-name']": job,
            "metadata.labels['controller-uid']": uid}


def workload(launch: deploy.Launch, cmd: list[str]) -> deploy.Launch:
    """The shipped agent with the test's training command after `--`."""
    argv = launch.argv[:launch.argv.index("--")] if "--" in launch.argv else launch.argv
    return deploy.Launch(launch.where, [*argv, "--", *cmd], dict(launch.env), launch.mounts)


def forged_blacklists(site: SecureSite, job: str, node: str, run_id: str,
                      sched: dict[str, str], by: str) -> list[tuple[bytes, bytes | None]]:
    """A blacklist of `node` for `job`, signed with what an agent holds (its node key), and
    unsigned, written with the processor's Kafka credentials (ACLs loosened, or its password
    stolen: the signature is the second line)."""
    from faultwatch import wire
    from faultwatch.core.events import Decision
    from faultwatch.trust.records import DECISION

    def dec(did: str) -> dict[str, Any]:
        return wire.decision_to_dict(Decision(
            id=did, job=job, attempt=0, action="blacklist", kind="error", ts=time.time(),
            nodes=(node,), rule="cuda.xid_hardware", run_id=run_id, scheduler=sched))

    node_signed = RecordSigner(read_signing_key(site.key(by)), DECISION)
    return [(job.encode(), orjson.dumps(node_signed.sign_record(dec(f"forged-{job}-k")))),
            (job.encode(), orjson.dumps(dec(f"forged-{job}-u")))]


def by_processor(site: SecureSite, job: str) -> list[dict[str, Any]]:
    """The job's decisions on the topic, without the forged ones this module wrote."""
    return [d for d in site.decisions("faultwatch.", job) if not d["id"].startswith("forged-")]


def test_case8_the_kubernetes_manifests_verify_what_they_act_on(
        site: SecureSite, shipped_processor: Path, webhook: str,
        tmp_path_factory: pytest.TempPathFactory) -> None:
    from tests.support import k8s

    why = k8s.missing()
    if why:
        pytest.skip(why)
    tmp = tmp_path_factory.mktemp("k8s-case")
    state = tmp / "k8s"
    state.mkdir()
    kube = k8s.start(state)
    procs: list[subprocess.Popen[bytes]] = []
    try:
        kube.apply_file(deploy.DEPLOY / "kubernetes" / "actuate-rbac.yaml")
        kube.namespace("ml")
        ctrl, victim = f"ctrl-{uuid.uuid4().hex[:6]}", f"victim-{uuid.uuid4().hex[:6]}"
        for n in K8S_NODES:
            kube.node(n)
        kube.pod("ml", f"{ctrl}-0", "node-a", {"training.kubeflow.org/job-name": ctrl})
        kube.pod("ml", f"{victim}-0", "node-b", {"training.kubeflow.org/job-name": victim})
        # the service account's token, as the kubelet projects it (in a kubeconfig: the
        # in-cluster files sit at a fixed path this machine does not have)
        kubeconfig = kube.kubeconfig(tmp / "kubeconfig",
                                     token=kube.token_for("faultwatch", "faultwatch-actuate"))
        svc = kubelet(site, tmp, webhook)
        notify_log, act_log = tmp / "notify.log", tmp / "actuate.log"
        procs.append(start(svc.launch("processor.yaml", "notify", {}), site, notify_log,
                           "--group-wait-s", "1", "--metrics-port", "0"))
        act = start(svc.launch("actuate-deployment.yaml", "actuate", {}), site, act_log,
                    "--metrics-port", "0", env={"KUBECONFIG": str(kubeconfig)})
        procs.append(act)
        wait_event(act_log, "actuate_following", 120, proc=act)
        wait_event(notify_log, "notify_started", 60, proc=procs[0])

        def agent(node: str, job: str, cmd: list[str]) -> deploy.Launch:
            return workload(kubelet(site, tmp, webhook, node).launch(
                "training-job.yaml", "trainer", k8s_fields(node, f"{job}-0", job,
                                                           f"uid-{job}")), cmd)

        vlog = tmp / "victim.log"
        vic = start(agent("node-b", victim, [sys.executable, "-c", FOREVER]), site, vlog)
        procs.append(vic)
        wait_until(lambda: b"training" in vlog.read_bytes(), 90, "the victim's job to start")
        # attack: a client with the agent's Kafka credentials and no key claims node-b
        thief = agent("node-b", victim, CRASH)
        del thief.env["FAULTWATCH_NODE_KEY_FILE"]
        start(thief, site, tmp / "thief.log").wait(90)
        # positive control: node-a's own agent (its key, its pod) hits an Xid
        start(agent("node-a", ctrl, CRASH), site, tmp / "ctrl.log").wait(90)

        def tainted(n: str) -> bool:
            return any(t["key"] == "faultwatch.io/quarantine" for t in
                       kube.get(f"/api/v1/nodes/{n}")["spec"].get("taints", []))

        wait_until(lambda: tainted("node-a"), 120, "node-a tainted for the control job")
        wait_until(lambda: any(ctrl.encode() in p for p in Hook.posted), 60,
                   "notify to post the control job's blacklist")
        # attack: forged blacklists of node-b through the processor's Kafka role
        site.produce("processor", "faultwatch.decisions", forged_blacklists(
            site, victim, "node-b", f"uid-{victim}", {"kind": "kubernetes", "namespace": "ml",
                                                      "pod": f"{victim}-0"}, "node-a"))
        for log, proc in ((act_log, act), (notify_log, procs[0]), (vlog, vic)):
            for reason in ("wrong_role", "unsigned"):
                wait_event(log, "decision_refused", 60, proc=proc,
                           where=lambda e, r=reason: e.get("reason") == r)
        site.wait_processed("faultwatch.")
        refused = [e["error"] for e in events(shipped_processor, "dead_letter")]
        assert any("refused (unsigned)" in e for e in refused), (
            refused, (tmp / "thief.log").read_text()[-2000:])
        assert by_processor(site, victim) == []
        assert [d["action"] for d in by_processor(site, ctrl)] == ["blacklist"]
        assert not tainted("node-b")
        assert vic.poll() is None and b"event=blacklisted" not in vlog.read_bytes()
        assert not any(victim.encode() in p for p in Hook.posted)
    finally:
        for p in procs:
            stop_group(p)
        k8s.stop(state)


def site_files(site: SecureSite, root: Path, webhook: str, node: str = "") -> None:
    """/etc/faultwatch as docs/operating.md and the units' headers lay it out on a host:
    the role client files (as `kafka up --secure` writes them), the trust file, the webhooks
    file, and on a node that node's key."""
    etc = root / "etc" / "faultwatch"
    (etc / "kafka").mkdir(parents=True, exist_ok=True)
    for role in ("actuator", "agent"):
        for name, data in site.client_files(role).items():
            (etc / "kafka" / name).write_bytes(data)
            os.chmod(etc / "kafka" / name, 0o600)
    (etc / "trust").write_bytes(site.trust.read_bytes())
    (etc / "webhooks").write_text(f"{webhook}\n")
    os.chmod(etc / "webhooks", 0o600)
    if node:
        (etc / "node.key").write_bytes(site.key(node).read_bytes())
        os.chmod(etc / "node.key", 0o640)


def test_case8_the_slurm_units_verify_what_they_act_on(
        site: SecureSite, shipped_processor: Path, webhook: str,
        tmp_path_factory: pytest.TempPathFactory) -> None:
    from tests.support.slurm import SlurmCluster, missing

    why = missing()
    if why:
        pytest.skip(why)
    tmp = tmp_path_factory.mktemp("slurm-case")
    slurm = SlurmCluster()
    slurm.start()
    procs: list[subprocess.Popen[bytes]] = []
    try:
        ctrl, victim = f"ctrl-{uuid.uuid4().hex[:6]}", f"victim-{uuid.uuid4().hex[:6]}"
        jobs = {}
        for job, node in ((ctrl, "n1"), (victim, "n2")):  # what slurmctld runs where
            jobs[job] = slurm.run("sbatch", "--parsable", "-w", node, f"--job-name={job}",
                                  "--output=/dev/null", "--wrap", "sleep 600"
                                  ).stdout.strip().split(";")[0]
        for jid in jobs.values():
            wait_until(lambda j=jid: slurm.job_info(j).get("JobState") == "RUNNING", 60,
                       f"Slurm job {jid} running", interval_s=0.3)
        service = tmp / "service"
        site_files(site, service, webhook)
        notify_log, act_log = tmp / "notify.log", tmp / "actuate.log"
        procs.append(start(deploy.unit("faultwatch-notify.service", service), site,
                           notify_log, "--group-wait-s", "1"))
        act = start(deploy.unit("faultwatch-actuate.service", service), site, act_log,
                    env={"SLURM_CONF": str(slurm.conf)})
        procs.append(act)
        wait_event(act_log, "actuate_following", 120, proc=act)
        wait_event(notify_log, "notify_started", 60, proc=procs[0])

        def agent(node: str, job: str, cmd: list[str]) -> tuple[deploy.Launch, dict[str, str]]:
            root = tmp / node
            site_files(site, root, webhook, node)
            launch = deploy.batch_agent("train.sbatch", root).expand(
                {"SLURM_JOB_NAME": job, "SLURM_NNODES": "1"})
            return workload(launch, cmd), {  # what srun gives each task
                "SLURM_JOB_ID": jobs[job], "SLURM_JOB_NAME": job, "SLURMD_NODENAME": node,
                "SLURM_NNODES": "1", "SLURM_NODEID": "0"}

        vlog = tmp / "victim.log"
        launch, task = agent("n2", victim, [sys.executable, "-c", FOREVER])
        vic = start(launch, site, vlog, env=task)
        procs.append(vic)
        wait_until(lambda: b"training" in vlog.read_bytes(), 90, "the victim's job to start")
        thief, task = agent("n2", victim, CRASH)  # the agent's credentials, no key
        del thief.env["FAULTWATCH_NODE_KEY_FILE"]
        start(thief, site, tmp / "thief.log", env=task).wait(90)
        launch, task = agent("n1", ctrl, CRASH)  # positive control: n1's own agent
        start(launch, site, tmp / "ctrl.log", env=task).wait(90)
        wait_until(lambda: "drain" in slurm.node_states().get("n1", ""), 120,
                   "n1 drained for the control job")
        wait_until(lambda: any(ctrl.encode() in p for p in Hook.posted), 60,
                   "notify to post the control job's blacklist")
        site.produce("processor", "faultwatch.decisions", forged_blacklists(
            site, victim, "n2", jobs[victim], {"kind": "slurm", "job_id": jobs[victim]}, "n1"))
        for log, proc in ((act_log, act), (notify_log, procs[0]), (vlog, vic)):
            for reason in ("wrong_role", "unsigned"):
                wait_event(log, "decision_refused", 60, proc=proc,
                           where=lambda e, r=reason, j=victim: e.get("reason") == r
                           and e.get("job", j) == j)
        site.wait_processed("faultwatch.")
        assert by_processor(site, victim) == []
        assert [d["action"] for d in by_processor(site, ctrl)] == ["blacklist"]
        assert "drain" not in slurm.node_states().get("n2", "")
        assert slurm.job_info(jobs[victim]).get("JobState") == "RUNNING"
        assert vic.poll() is None and b"event=blacklisted" not in vlog.read_bytes()
        assert not any(victim.encode() in p for p in Hook.posted)
    finally:
        for p in procs:
            stop_group(p)
        slurm.stop()


# ---- case 9: smaller -------------------------------------------------------------------------

def blacklist(job: str, node: str, did: str) -> dict[str, Any]:
    from faultwatch import wire
    from faultwatch.core.events import Decision

    return wire.decision_to_dict(Decision(
        id=did, job=job, attempt=0, action="blacklist", kind="error", ts=time.time(),
        nodes=(node,), rule="cuda.xid_hardware", run_id="slurm-7",
        scheduler={"kind": "slurm", "job_id": "7"}))


def nodes_json(site: SecureSite, prefix: str) -> dict[str, dict[str, Any]]:
    res = subprocess.run([faultwatch_exe(), "nodes", "--json"], env=site.env("admin", prefix),
                         capture_output=True, text=True, timeout=60)
    assert res.returncode == 0, res.stderr
    return {d["node"]: d for d in map(orjson.loads, res.stdout.splitlines()) if d}


def test_case9_no_requeue_after_a_refused_drain_and_no_replayed_quarantine(
        site: SecureSite, tmp_path: Path) -> None:
    from faultwatch.trust.records import DECISION

    prefix = new_prefix(site, "small")
    act = Actuate(site, prefix, tmp_path, alloc={"job-ok": "n-ok"}).started()
    ops_env = site.env("admin", prefix, FAULTWATCH_SIGNING_KEY_FILE=str(site.key("ops")))
    try:
        # a processor-signed blacklist for a job the scheduler does not run on n-x: refused,
        # and its requeue hook never runs (the positive control: job-ok on n-ok)
        signer = RecordSigner(read_signing_key(site.key("proc")), DECISION)
        site.produce("processor", f"{prefix}decisions", [
            (b"job-x", orjson.dumps(signer.sign_record(blacklist("job-x", "n-x", "dx")))),
            (b"job-ok", orjson.dumps(signer.sign_record(blacklist("job-ok", "n-ok", "dok"))))])
        wait_until(lambda: "n-ok" in act.nodes("requeued"), 60, "job-ok requeued off n-ok")
        wait_event(act.log, "actuate_refused", 30, proc=act.proc,
                   where=lambda e: e.get("node") == "n-x")
        assert act.nodes("drained") == ["n-ok"]
        assert act.nodes("requeued") == ["n-ok"], "a requeue after its drain was refused"
        # an operator's quarantine and release, then the quarantine's signed bytes again
        for argv in (["quarantine", "n-r", "--for", "1h", "--reason", "bad DIMM"],
                     ["release", "n-r", "--reason", "DIMM replaced"]):
            res = subprocess.run([faultwatch_exe(), "nodes", *argv], env=ops_env,
                                 capture_output=True, text=True, timeout=60)
            assert res.returncode == 0, res.stderr
        wait_until(lambda: "n-r" in act.nodes("released"), 60, "n-r drained, then resumed")
        raw = [v for k, v in site.records(f"{prefix}nodes") if k == b"n-r" and v]
        assert [orjson.loads(v)["state"] for v in raw] == ["quarantined", "healthy"]
        site.produce("admin", f"{prefix}nodes", [(b"n-r", raw[0])])  # seconds later
        site.produce("admin", f"{prefix}nodes", [(b"n-f", orjson.dumps({  # forged: unsigned
            "v": 1, "t": "node", "node": "n-f", "state": "quarantined",
            "until": time.time() + 86400, "strikes": 1, "reasons": [],
            "updated_ts": time.time(), "seq": 99}))])
        wait_event(act.log, "node_record_refused", 60, proc=act.proc,
                   where=lambda e: e.get("reason") == "replayed")
        wait_event(act.log, "node_record_refused", 60, proc=act.proc,
                   where=lambda e: e.get("reason") == "unsigned")
        shown = nodes_json(site, prefix)  # `faultwatch nodes` with the trust file
        assert shown["n-r"]["state"] == "healthy", shown["n-r"]
        assert shown["n-r"]["refused"]["reasons"] == {"replayed": 1}, shown["n-r"]
        assert shown["n-f"]["state"] is None and shown["n-f"]["refused"]["reasons"] == {
            "unsigned": 1}, shown["n-f"]
        assert act.nodes("drained").count("n-r") == 1 and "n-f" not in act.nodes("drained")
    finally:
        act.stop()


def test_case9_webhook_tokens_stay_off_argv_and_the_broker_dir_is_private(
        site: SecureSite, tmp_path: Path) -> None:
    # every topic's data and the SCRAM hashes (the metadata log) are the broker owner's alone
    assert stat.S_IMODE(site.data.stat().st_mode) == 0o700, oct(site.data.stat().st_mode)
    open_to_others = [str(p) for p in (site.data / "logs").rglob("*")
                      if p.lstat().st_mode & 0o077]
    assert (site.data / "logs" / "__cluster_metadata-0").is_dir() and not open_to_others, \
        open_to_others[:5]
    url = "https://chat.example.com/hooks/xi3nn9qm6jf5zbx7ur5xhwb8me"  # Mattermost
    try:
        res = subprocess.run([faultwatch_exe(), "notify", "--webhook", url],
                             env=site.env("actuator", **CODE), capture_output=True, text=True,
                             timeout=30)
    except subprocess.TimeoutExpired:
        raise AssertionError("notify ran with the webhook's key on its command line") from None
    assert res.returncode == 2 and "--webhook-file" in res.stderr, res.stderr
    assert "xi3nn9qm6jf5zbx7ur5xhwb8me" not in res.stderr + res.stdout
    (tmp_path / "hooks").write_text(f"{url}\n")  # positive control: from a file it starts
    log = tmp_path / "notify.log"
    with open(log, "wb") as fh:
        proc = subprocess.Popen([faultwatch_exe(), "notify", "--webhook-file",
                                 str(tmp_path / "hooks")], stdout=fh, stderr=subprocess.STDOUT,
                                env=site.env("actuator", **CODE), start_new_session=True)
    try:
        wait_event(log, "notify_started", 60, proc=proc)
    finally:
        stop_group(proc)


def test_case9_a_rule_set_replayed_seconds_later_is_refused(
        site: SecureSite, shipped_processor: Path, tmp_path: Path) -> None:
    """Two operator-signed pushes, then the first one's record written again at once: the
    shipped processor refuses it (`replayed`: its revision is lower) and keeps the second."""
    env = site.env("admin", FAULTWATCH_SIGNING_KEY_FILE=str(site.key("ops")), **CODE)
    def pushed_loads() -> int:
        return sum(e.get("source") == "pushed" for e in events(shipped_processor,
                                                                "rules_loaded"))

    for name in ("first", "second"):
        (tmp_path / f"{name}.yaml").write_text(
            f"version: 1\nrules:\n  - id: ops.{name}\n    category: retryable\n"
            f"    contains: {name} flaky fs\n")
        before = pushed_loads()
        res = subprocess.run([faultwatch_exe(), "rules", "push", str(tmp_path / f"{name}.yaml")],
                             env=env, capture_output=True, text=True, timeout=120)
        assert res.returncode == 0, res.stderr
        wait_until(lambda b=before: pushed_loads() > b, 60, f"the {name} set loaded")
    pushed = [v for k, v in site.records("faultwatch.rules") if k == b"ruleset" and v]
    first = next(v for v in pushed if b"ops.first" in v)
    loaded = len(events(shipped_processor, "rules_loaded"))
    site.produce("admin", "faultwatch.rules", [(b"ruleset", first)])
    e = wait_event(shipped_processor, "rules_refused", 60,
                   where=lambda e: e.get("reason") == "replayed")
    assert "revision" in e.get("detail", "") or "seq" in e.get("detail", ""), e
    assert len(events(shipped_processor, "rules_loaded")) == loaded


# ---- 1, 3, 4: a node's key on the processor (its own prefix, one processor for the rows) ---

P35 = "fw35."
XID = "NVRM: Xid (PCI:0000:3b:00): 79, pid=4242, GPU has fallen off the bus."
FOREVER = "import time\nprint('training', flush=True)\nwhile True: time.sleep(0.1)\n"
# the scheduler stand-in: prints the nodes of Slurm job argv[2] per the allocation file
ALLOC = ("import sys\nalloc = dict(l.split() for l in open(sys.argv[1]) if l.strip())\n"
         "sys.exit(1) if sys.argv[2] not in alloc else print(alloc[sys.argv[2]])\n")
# runs until a file appears, then prints an Xid line and fails
XID_ON = ("import os, sys, time\nprint('training', flush=True)\n"
          "while not os.path.exists(sys.argv[1]): time.sleep(0.1)\n"
          f"print({XID!r}, file=sys.stderr, flush=True)\nsys.exit(1)\n")
MAX_AGE_S, TTL_S, LOST_S = 30.0, 20.0, 8.0


class Proc35:
    """The rows' processor (allocation check, a 100-job cap, a 30 s decision age, a 20 s
    time-to-live) and what the rows read, on prefix P35."""

    def __init__(self, site: SecureSite, alloc: Path, log: Path) -> None:
        self.site, self.alloc, self.log = site, alloc, log
        self.admin = site.security("admin").client_kwargs()

    def decisions(self, job: str) -> list[dict[str, Any]]:
        return self.site.decisions(P35, job)

    def wait_decisions(self, job: str, timeout_s: float = 90.0) -> list[dict[str, Any]]:
        return wait_until(lambda: self.decisions(job), timeout_s, f"a decision of {job}",
                          interval_s=1.0, until=bool, raise_on_timeout=False)

    def raw_decisions(self, job: str) -> list[dict[str, Any]]:
        """Every record about `job` on the decisions topic (copies of one id included)."""
        out = [orjson.loads(m.value) for m in self.site.messages(f"{P35}decisions")]
        return [d for d in out if d.get("job") == job]

    def agent(self, job: str, node: str, cmd: list[str], spool: Path, *flags: str,
              key: str | None = None) -> list[str]:
        return [faultwatch_exe(), "agent", "--job", job, "--node", node, "--heartbeat-s", "1",
                "--node-key-file", str(self.site.key(key or node)), "--no-follow-decisions",
                "--spool-dir", str(spool), *flags, "--", *cmd]

    def env(self, **extra: str) -> dict[str, str]:
        return self.site.env("agent", P35, **extra, **CODE)

    def run(self, job: str, node: str, cmd: list[str], spool: Path, *flags: str,
            **env: str) -> None:
        subprocess.run(self.agent(job, node, cmd, spool, *flags), env=self.env(**env),
                       capture_output=True, timeout=90)

    def start(self, job: str, node: str, cmd: list[str], log: Path, *flags: str,
              **env: str) -> subprocess.Popen[bytes]:
        with open(log, "wb") as fh:
            return subprocess.Popen(self.agent(job, node, cmd, log.with_suffix(".spool"),
                                               *flags), stdout=fh, stderr=subprocess.STDOUT,
                                    env=self.env(**env), start_new_session=True)


@pytest.fixture(scope="module")
def proc35(site: SecureSite, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Proc35]:
    from tests.support.cluster import processor, wait_processor_ready

    made = site.new_prefix(P35)
    assert made.returncode == 0, made.stderr[-3000:]
    root = tmp_path_factory.mktemp("p35")
    alloc, log = root / "alloc", root / "processor.log"
    alloc.write_text("")
    check = orjson.dumps([sys.executable, "-c", ALLOC, str(alloc), "{job_id}"]).decode()
    asks = ["--allocation-check", "exec", "--allocation-exec", check]
    if CODE and "allocation-check" not in (
            Path(CODE["PYTHONPATH"]) / "faultwatch" / "cli" / "process.py").read_text():
        asks = []  # an older tree (how these rows were seen to fail before issue 35)
    env = site.env("processor", P35, FAULTWATCH_SIGNING_KEY_FILE=str(site.key("proc")),
                   FAULTWATCH_MAX_JOBS="100", FAULTWATCH_MAX_DECISION_AGE_S=str(MAX_AGE_S),
                   FAULTWATCH_FINISHED_TTL_S=str(TTL_S), **CODE)
    with processor(site.bootstrap, P35, log, "--settle-s", "0.5", "--node-lost-s", str(LOST_S),
                   "--metrics-port", "0", *asks, env=env) as proc:
        wait_processor_ready(site.bootstrap, P35, proc, log, 180,
                             site.security("admin").client_kwargs())
        yield Proc35(site, alloc, log)


def test_case1_issue35_a_node_cannot_spend_a_job_it_does_not_run(proc35: Proc35,
                                                                  tmp_path: Path) -> None:
    """VICTIM runs under Slurm (job 4242) on GOODNODE. BADNODE's key: four runs of `--job
    VICTIM` with generated run ids and an Xid line (the issue's attack: each restarted
    VICTIM and four spent its budget), then VICTIM's own run id claimed by flag and by
    SLURM_JOB_ID. No decision about VICTIM, no budget spent (refused other_run and
    not_allocated, counted). Positive control: VICTIM's own Xid blacklists GOODNODE alone
    with its first restart of the budget."""
    from tests.support.cluster import refused_metric

    p, job = proc35, f"victim-{uuid.uuid4().hex[:6]}"
    slurm = {"SLURM_JOB_ID": "4242", "SLURMD_NODENAME": "GOODNODE", "SLURM_JOB_NAME": job}
    p.alloc.write_text("4242 GOODNODE\n")
    trigger, vlog = tmp_path / "fail-now", tmp_path / "victim.log"
    vic = p.start(job, "GOODNODE", [sys.executable, "-c", XID_ON, str(trigger)], vlog,
                  "--follow-decisions", **slurm)
    try:
        wait_until(lambda: b"training" in vlog.read_bytes(), 90, "the victim's child to start")
        attack = ["sh", "-c", f"echo '{XID}' >&2; exit 1"]
        claims: list[tuple[list[str], dict[str, str]]] = [
            ([], {"FAULTWATCH_ATTEMPT": str(n)}) for n in range(4)]
        claims += [(["--run-id", "4242"], {}), ([], slurm)]
        for n, (flags, env) in enumerate(claims):
            p.run(job, "BADNODE", attack, tmp_path / f"a{n}", *flags, **env)
        p.site.wait_processed(P35)
        assert p.decisions(job) == []
        assert vic.poll() is None
        counted = refused_metric(p.log)
        assert counted.get(("run", "other_run"), 0) >= 4, counted
        assert counted.get(("run", "not_allocated"), 0) >= 2, counted
        trigger.touch()  # the positive control
        got = p.wait_decisions(job)
        assert [(d["action"], d["targets"]["nodes"], d["evidence"]["restart_nodes"],
                 d["budgets"]["restarts_used"]) for d in got] == [
            ("blacklist", ["GOODNODE"], ["GOODNODE"], 1)], got
    finally:
        stop_group(vic)


def test_case3_issue35_one_nodes_key_neither_fills_the_table_nor_holds_a_lost_node(
        proc35: Proc35, tmp_path: Path) -> None:
    """BADNODE's key writes 150 one-record jobs (signed run-starts, as fast as the broker
    takes them) into a worker capped at 100 jobs. Before: the cap was reached, a real job's
    Xid then got no decision (its agent exit 77), and the phantoms going silent together
    tripped the blast-radius guard, which held a real lost node's decision (600 s). Now the
    node's quota keeps 60, the real job is decided, and so is the lost node."""
    import signal

    from faultwatch import wire
    from faultwatch.core.events import RunStart
    from tests.support.cluster import refused_metric

    p, t = proc35, time.time()
    phantoms = [f"ph-{uuid.uuid4().hex[:8]}" for _ in range(150)]
    p.site.produce_signed("BADNODE", f"{P35}logs", [
        (wire.log_key(j, "BADNODE"), wire.encode_run_start(
            RunStart(j, 0, "BADNODE", t, run_id=f"g-{j}", run_source="generated")))
        for j in phantoms])
    healthy, lost = f"healthy-{uuid.uuid4().hex[:6]}", f"lost-{uuid.uuid4().hex[:6]}"
    agents = [p.start(job, node, [sys.executable, "-c", FOREVER], tmp_path / f"{job}.log")
              for job, node in ((healthy, "CTRLNODE"), (lost, "NODE5"))]
    try:
        real = f"real-{uuid.uuid4().hex[:6]}"
        p.run(real, "NODE4", ["sh", "-c", f"echo '{XID}' >&2; exit 1"], tmp_path / "real")
        got = p.wait_decisions(real)
        assert [d["action"] for d in got] == ["blacklist"], got
        counted = refused_metric(p.log)  # 120 run-starts a minute, 60 new jobs of them
        assert counted.get(("run", "quota_run_starts"), 0) >= 30, counted
        assert counted.get(("run", "quota_new_jobs"), 0) >= 60, counted
        # the lost node: its agent frozen among the silent phantoms
        assert all(a.poll() is None for a in agents)
        os.killpg(agents[1].pid, signal.SIGSTOP)
        got = p.wait_decisions(lost, 120)
        assert [d["reason"]["kind"] for d in got] == ["node-lost"], got
        assert "event=fleet_storm_tripped" not in p.log.read_text()
    finally:
        for a in agents:
            if a.poll() is None:
                os.killpg(a.pid, signal.SIGCONT)
            stop_group(a)


def test_case4_issue35_history_is_not_decided_again(proc35: Proc35, tmp_path: Path) -> None:
    """Job HIST is blacklisted (NODE7's Xid). Past the decision age limit (30 s here) and
    its state's time-to-live: (1) NODE7's own signed records of it are sent again (an agent
    may read the logs topic); (2) a processor with a new app id (a new consumer group and
    table, as after `offsets.retention.minutes`) reads the logs topic from its start. Before:
    each published the old blacklist again, same id, a fresh `ts`. Now neither publishes a
    decision about evidence that old (withheld, logged). Positive control: a new job's Xid is
    decided by the new processor."""
    from faultwatch import wire
    from tests.support.cluster import processor, wait_processed

    p, job = proc35, f"hist-{uuid.uuid4().hex[:6]}"
    xid = ["sh", "-c", f"echo '{XID}' >&2; exit 1"]
    p.run(job, "NODE7", xid, tmp_path / "h")
    first = p.wait_decisions(job)
    assert [d["action"] for d in first] == ["blacklist"], first
    decided_at = float(first[0]["ts"])
    wait_event(p.log, "jobs_expired", 120,
               where=lambda e: time.time() > decided_at + max(MAX_AGE_S, TTL_S) + 5)
    # (1) the node's own records of the job, read off the logs topic and sent again
    mine = [m for m in p.site.messages(f"{P35}logs") if m.key == wire.log_key(job, "NODE7")]
    assert mine
    p.site.produce_raw("agent", f"{P35}logs", [(m.key, m.value, list(m.headers))
                                               for m in mine])
    p.site.wait_processed(P35)
    assert len(p.raw_decisions(job)) == 1, p.raw_decisions(job)
    wait_event(p.log, "decision_withheld", 30)  # it was read and decided again
    # (2) a new app id reads the whole logs topic
    app = f"{P35}processor-b"
    p.site.grant_app(P35, app)
    log = tmp_path / "processor-b.log"
    env = p.site.env("processor", P35, FAULTWATCH_SIGNING_KEY_FILE=str(p.site.key("proc")),
                     FAULTWATCH_MAX_DECISION_AGE_S=str(MAX_AGE_S), **CODE)
    with processor(p.site.bootstrap, P35, log, "--settle-s", "0.5", "--app-id", app,
                   env=env) as proc:
        wait_event(log, "partitions_assigned", 180,
                   lambda e: e.get("partitions") != "-", proc=proc)
        fresh = f"fresh-{uuid.uuid4().hex[:6]}"
        p.run(fresh, "NODE7", xid, tmp_path / "f")
        # the positive control: the new processor decides a new job
        wait_event(log, "decision", 120, where=lambda e: e.get("job") == fresh, proc=proc)
        wait_processed(p.site.bootstrap, P35, 120, p.admin, group=app)
        assert "event=decision_withheld" in log.read_text()  # history re-decided, kept in
        assert proc.poll() is None, log.read_text()[-3000:]
    assert len(p.raw_decisions(job)) == 1, p.raw_decisions(job)
