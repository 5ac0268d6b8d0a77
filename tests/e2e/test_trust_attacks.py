"""Issue 28's attacks against the real broker, processor, agents, `actuate` and `notify`, set
up the way docs/operating.md says (processor key, operator key, node keys, one trust file):

1. a second agent claiming VICTIM's job on GOODNODE (no key, or another node's key) prints an
   Xid 79 line: no decision, no drain (positive control: GOODNODE's own key on job CTRL is
   blacklisted and drained); an agent speaking for its own node about a job the scheduler
   does not run there gets its node's blacklist refused by `actuate` (not_allocated);
2. a hand-written quarantine on the nodes topic is refused by actuate (an operator-signed
   `faultwatch nodes quarantine` is carried out), and the processor blacklists no job placed
   on that node (a job on the operator-quarantined node is);
3. an unsigned `rules push` is refused by the command (exit 8), and the same set written
   around it is refused by the processor (a signed one is loaded);
4. run 1's restart decision does not restart run 2 of the reused job name; a 40-minute-old
   signed decision replayed to `notify` is not posted (a fresh one is);
5. a blacklist signed with what an agent holds (a node key) or with the legacy HMAC key is
   refused by `actuate`.

Every refusal is also read back from the refusing process's /metrics
(`faultwatch_refused_total{what,reason}`: processor, agent, `actuate`, `notify`).

With FAULTWATCH_TRUST_TESTS_OFF=1 the same tests run without keys, --exec-confirm and
--replay-state, and FAULTWATCH_TRUST_TESTS_CODE=/path/to/an/old/tree runs the faultwatch
processes from that tree: that is how they were checked to fail on the code before issue 28.

Issue 35's rows (cases 6-9) run on a locked-down broker with the shipped deploy/ configuration:
test_trust_attacks_secure.py."""

from __future__ import annotations

import http.server
import os
import socketserver
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

from faultwatch import wire
from faultwatch.core.events import Decision
from faultwatch.trust.keys import generate, read_signing_key
from faultwatch.trust.records import DECISION, RecordSigner
from faultwatch.wire.signing import Key, Keyring, sign
from tests.support.cluster import (
    agent_cmd,
    decisions,
    events,
    processor,
    refused_metric,
    wait_event,
    wait_processed,
    wait_processor_ready,
)
from tests.support.processes import faultwatch_exe, job_env
from tests.support.waiting import wait_until

pytestmark = [pytest.mark.slow, pytest.mark.kafka]

OFF = os.environ.get("FAULTWATCH_TRUST_TESTS_OFF") == "1"
CODE = {"PYTHONPATH": os.environ["FAULTWATCH_TRUST_TESTS_CODE"]} \
    if os.environ.get("FAULTWATCH_TRUST_TESTS_CODE") else {}
XID = "NVRM: Xid (PCI:0000:3b:00): 79, pid=4242, GPU has fallen off the bus."
FOREVER = "import time\nprint('training', flush=True)\nwhile True: time.sleep(0.1)\n"
RECORD = "import sys\nopen(sys.argv[1], 'a').write(' '.join(sys.argv[2:]) + '\\n')\n"
# the scheduler stand-in: exit 0 when job argv[2] runs on node argv[3] per the allocation file
CONFIRM = ("import sys\nalloc = dict(l.split() for l in open(sys.argv[1]) if l.strip())\n"
           "sys.exit(0 if sys.argv[3] in alloc.get(sys.argv[2], '').split(',') else 1)\n")


class Site:
    """Keys, trust file and environments of one secured site."""

    def __init__(self, d: Path) -> None:
        d.mkdir(parents=True, exist_ok=True)
        self.dir = d
        lines = []
        for role, name in (("processor", "proc"), ("operator", "ops"), ("node", "GOODNODE"),
                           ("node", "BADNODE"), ("node", "CTRLNODE"), ("node", "NODE4"),
                           ("node", "NODE5"), ("node", "NODE6")):
            lines.append(generate(d / f"{name}.key", role, name if role == "node" else "")
                         .line())
        (d / "trust").write_text("\n".join(lines) + "\n")

    def key(self, name: str) -> Path:
        return self.dir / f"{name}.key"

    def env(self, **extra: str) -> dict[str, str]:
        """A consumer's environment: the trust file (nothing with OFF)."""
        e = {k: v for k, v in job_env().items() if not k.startswith("FAULTWATCH_DECISION_KEY")}
        if not OFF:
            e["FAULTWATCH_TRUST_FILE"] = str(self.dir / "trust")
        e.update(extra, **CODE)
        return e

    def processor_env(self) -> dict[str, str]:
        return dict(CODE) if OFF else {"FAULTWATCH_TRUST_FILE": str(self.dir / "trust"),
                                       "FAULTWATCH_SIGNING_KEY_FILE": str(self.key("proc")),
                                       **CODE}

    def node_flags(self, name: str) -> list[str]:
        return [] if OFF else ["--node-key-file", str(self.key(name))]


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Site:
    return Site(tmp_path_factory.mktemp("site"))


@pytest.fixture(scope="module")
def cluster(kafka_bootstrap: str, site: Site, tmp_path_factory: pytest.TempPathFactory
            ) -> Iterator[tuple[str, Path]]:
    """One processor for the module: (prefix, its log)."""
    prefix = f"trust{uuid.uuid4().hex[:8]}."
    log = tmp_path_factory.mktemp("proc") / "processor.log"
    with processor(kafka_bootstrap, prefix, log, "--settle-s", "0.5", "--metrics-port", "0",
                   env=site.processor_env()) as proc:
        wait_processor_ready(kafka_bootstrap, prefix, proc, log)
        yield prefix, log


def start_actuate(bootstrap: str, prefix: str, site: Site, tmp: Path,
                  alloc: dict[str, str]) -> tuple[subprocess.Popen[bytes], Path, Path]:
    (tmp / "alloc").write_text("".join(f"{j} {n}\n" for j, n in alloc.items()))
    drained, log = tmp / "drained", tmp / "actuate.log"
    drain = orjson.dumps([sys.executable, "-c", RECORD, str(drained), "{node}",
                          "{decision}"]).decode()
    confirm = orjson.dumps([sys.executable, "-c", CONFIRM, str(tmp / "alloc"), "{job}",
                            "{node}"]).decode()
    with open(log, "wb") as fh:
        proc = subprocess.Popen(
            [faultwatch_exe(), "actuate", "--backend", "exec", "--exec-quarantine", drain,
             *([] if OFF else ["--exec-confirm", confirm]), "--bootstrap", bootstrap,
             "--topic-prefix", prefix,
             "--state-file", str(tmp / "state.jsonl"), "--metrics-port", "0"],
            stdout=fh, stderr=subprocess.STDOUT, env=site.env(), start_new_session=True)
    wait_event(log, "actuate_started", 60, proc=proc)
    return proc, drained, log


def read(p: Path) -> str:
    return p.read_text() if p.exists() else ""


def produce(bootstrap: str, topic: str, key: bytes, values: list[bytes | None]) -> None:
    import asyncio

    from aiokafka import AIOKafkaProducer

    async def main() -> None:
        p = AIOKafkaProducer(bootstrap_servers=bootstrap, acks="all")
        await p.start()
        try:
            for v in values:
                await p.send_and_wait(topic, v, key=key)
        finally:
            await p.stop()

    asyncio.run(main())


def blacklist(job: str, node: str, did: str, ts: float | None = None) -> dict[str, Any]:
    return wire.decision_to_dict(Decision(
        id=did, job=job, attempt=0, action="blacklist", kind="error",
        ts=time.time() if ts is None else ts, nodes=(node,), rule="cuda.xid_hardware",
        run_id="slurm-1", scheduler={"kind": "slurm", "job_id": "1"}))


def stop(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(20)
        except subprocess.TimeoutExpired:
            proc.kill()


# ---- case 1 --------------------------------------------------------------------------------

def test_case1_an_agent_speaks_only_for_its_own_node(kafka_bootstrap: str, site: Site,
                                                     cluster: tuple[str, Path],
                                                     tmp_path: Path) -> None:
    prefix, plog = cluster
    b = kafka_bootstrap
    victim, ctrl = f"victim-{uuid.uuid4().hex[:6]}", f"ctrl-{uuid.uuid4().hex[:6]}"
    act, drained, alog = start_actuate(b, prefix, site, tmp_path,
                                       {victim: "GOODNODE", ctrl: "CTRLNODE"})
    vlog = tmp_path / "victim.log"
    with open(vlog, "wb") as fh:
        vic = subprocess.Popen(agent_cmd(b, prefix, victim, "GOODNODE",
                                         [sys.executable, "-c", FOREVER],
                                         "--follow-decisions", "--spool-dir",
                                         str(tmp_path / "sv"), *site.node_flags("GOODNODE")),
                               stdout=fh, stderr=subprocess.STDOUT, env=site.env(),
                               start_new_session=True)
    try:
        wait_until(lambda: b"training" in vlog.read_bytes(), 60, "the victim's child to start")
        attack = ["sh", "-c", f"echo '{XID}' >&2; exit 1"]
        for n, flags in enumerate(([], site.node_flags("BADNODE"))):  # no key, another's key
            subprocess.run(agent_cmd(b, prefix, victim, "GOODNODE", attack, "--spool-dir",
                                     str(tmp_path / f"sa{n}"), *flags),
                           env=site.env(), capture_output=True, timeout=60)
        # positive control: a node's own key, a job the scheduler runs there
        subprocess.run(agent_cmd(b, prefix, ctrl, "CTRLNODE", attack, "--spool-dir",
                                 str(tmp_path / "sc"), *site.node_flags("CTRLNODE")),
                       env=site.env(), capture_output=True, timeout=60)
        wait_until(lambda: "CTRLNODE" in read(drained), 90, "the control job's node drained")
        wait_processed(b, prefix)
        refused = [e["error"] for e in events(plog, "dead_letter")]
        assert any("refused (unsigned)" in e for e in refused), refused
        assert any("refused (wrong_node)" in e for e in refused), refused
        assert [d["action"] for d in decisions(b, prefix, victim)] == []
        assert "GOODNODE" not in read(drained)
        assert vic.poll() is None and b"event=blacklisted" not in vlog.read_bytes()
        counted = refused_metric(plog)  # the processor's /metrics says so too
        assert counted.get(("logs", "unsigned"), 0) >= 1, counted
        assert counted.get(("logs", "wrong_node"), 0) >= 1, counted
        # BADNODE's agent about its own node, for a job the scheduler runs elsewhere
        subprocess.run(agent_cmd(b, prefix, f"{victim}-x", "BADNODE", attack, "--spool-dir",
                                 str(tmp_path / "sb"), *site.node_flags("BADNODE")),
                       env=site.env(), capture_output=True, timeout=60)
        wait_event(alog, "actuate_refused", 90,
                   where=lambda e: e.get("node") == "BADNODE"
                   and e.get("reason") == "not_allocated", proc=act)
        assert "BADNODE" not in read(drained)
        assert refused_metric(alog).get(("actuate", "not_allocated"), 0) >= 1
    finally:
        stop(vic)
        stop(act)


# ---- case 2 --------------------------------------------------------------------------------

def test_case2_a_hand_written_registry_record_is_refused(kafka_bootstrap: str, site: Site,
                                                        tmp_path: Path) -> None:
    prefix = f"trustn{uuid.uuid4().hex[:8]}."
    act, drained, alog = start_actuate(kafka_bootstrap, prefix, site, tmp_path, {})
    try:
        forged = {"v": 1, "t": "node", "node": "prod-gpu-07", "state": "quarantined",
                  "until": time.time() + 365 * 86400, "strikes": 1, "reasons": [],
                  "updated_ts": time.time()}
        produce(kafka_bootstrap, f"{prefix}nodes", b"prod-gpu-07", [orjson.dumps(forged)])
        env = site.env() if OFF else site.env(
            FAULTWATCH_SIGNING_KEY_FILE=str(site.key("ops")))
        res = subprocess.run([faultwatch_exe(), "nodes", "--bootstrap", kafka_bootstrap,
                              "--topic-prefix", prefix, "quarantine", "prod-gpu-08", "--for",
                              "1h", "--reason", "bad DIMM"], env=env, capture_output=True,
                             text=True, timeout=60)
        assert res.returncode == 0, res.stderr
        wait_until(lambda: "prod-gpu-08" in read(drained), 60, "the signed quarantine")
        assert "prod-gpu-07" not in read(drained)
        e = wait_event(alog, "node_record_refused", 10, proc=act)
        assert e["reason"] == "unsigned"
        assert refused_metric(alog).get(("node_record", "unsigned"), 0) >= 1
    finally:
        stop(act)


def test_case2_the_processor_blacklists_no_job_for_a_forged_quarantine(
        kafka_bootstrap: str, site: Site, cluster: tuple[str, Path], tmp_path: Path) -> None:
    """The other half of case 2: a job placed on a node with a forged quarantine record is not
    blacklisted by the processor; one on an operator-quarantined node is (positive control)."""
    prefix, plog = cluster
    b = kafka_bootstrap
    env = site.env() if OFF else site.env(FAULTWATCH_SIGNING_KEY_FILE=str(site.key("ops")))
    res = subprocess.run([faultwatch_exe(), "nodes", "--bootstrap", b, "--topic-prefix", prefix,
                          "quarantine", "NODE6", "--for", "1h", "--reason", "bad DIMM"],
                         env=env, capture_output=True, text=True, timeout=60)
    assert res.returncode == 0, res.stderr
    forged = {"v": 1, "t": "node", "node": "NODE5", "state": "quarantined",
              "until": time.time() + 365 * 86400, "strikes": 1, "reasons": [],
              "updated_ts": time.time()}
    # written after the signed one on the one-partition topic: its refusal means both were read
    produce(b, f"{prefix}nodes", b"NODE5", [orjson.dumps(forged)])
    wait_event(plog, "node_record_refused", 60, where=lambda e: e.get("reason") == "unsigned")
    forged_job, signed_job = f"placed-{uuid.uuid4().hex[:6]}", f"placed-{uuid.uuid4().hex[:6]}"
    short = ["sh", "-c", "echo training; sleep 2"]
    for job, node in ((forged_job, "NODE5"), (signed_job, "NODE6")):
        subprocess.run(agent_cmd(b, prefix, job, node, short, "--spool-dir",
                                 str(tmp_path / job), *site.node_flags(node)),
                       env=site.env(), capture_output=True, timeout=60)
    wait_until(lambda: any(d["action"] == "blacklist" for d in decisions(b, prefix, signed_job)),
               60, "the job on the operator-quarantined node blacklisted")
    wait_processed(b, prefix)
    assert [d["action"] for d in decisions(b, prefix, forged_job)] == []
    assert refused_metric(plog).get(("node_record", "unsigned"), 0) >= 1


# ---- case 3 --------------------------------------------------------------------------------

def test_case3_only_an_operator_signed_rule_set_is_loaded(kafka_bootstrap: str, site: Site,
                                                         cluster: tuple[str, Path],
                                                         tmp_path: Path) -> None:
    prefix, plog = cluster
    (tmp_path / "evil.yaml").write_text(
        "version: 1\nrules:\n  - id: evil.step\n    category: hardware\n    contains: step\n")
    push = [faultwatch_exe(), "rules", "push", "--bootstrap", kafka_bootstrap,
            "--topic-prefix", prefix, str(tmp_path / "evil.yaml"), "--no-builtin"]
    if not (CODE or OFF):  # the worker has announced its trust policy (a few s after start)
        show = [faultwatch_exe(), "rules", "show", "--bootstrap", kafka_bootstrap,
                "--topic-prefix", prefix]
        wait_until(lambda: subprocess.run(show, env=site.env(), capture_output=True,
                                          text=True, timeout=60).stdout, 60,
                   "the worker's trust policy", interval_s=1.0,
                   until=lambda out: "trust file: verifies" in out)
    res = subprocess.run(push, env=site.env(), capture_output=True, text=True, timeout=60)
    if CODE or OFF:  # the command before issue 36, or no keys: it writes the set
        assert res.returncode == 0, res.stderr
    else:  # the command reads the trust policy the workers announce and refuses it itself
        assert res.returncode == 8 and "rules push refused" in res.stderr, res.stderr
        import asyncio

        from faultwatch.rollout.rules_push import publish_record
        from faultwatch.rollout.rules_record import build_record

        record, _ = build_record([tmp_path / "evil.yaml"], builtin=False)
        asyncio.run(publish_record(kafka_bootstrap, f"{prefix}rules", record))  # around it
    e = wait_event(plog, "rules_refused", 60)
    assert e["reason"] == "unsigned"
    assert refused_metric(plog).get(("rules", "unsigned"), 0) >= 1
    (tmp_path / "ok.yaml").write_text(
        "version: 1\nrules:\n  - id: ops.flaky_fs\n    category: retryable\n"
        "    contains: flaky fs\n")
    ok = [*push[:-2], str(tmp_path / "ok.yaml"), "--signing-key-file", str(site.key("ops"))]
    res = subprocess.run(ok, env=site.env(), capture_output=True, text=True, timeout=60)
    assert res.returncode == 0 and "signed by key" in res.stdout, res.stderr
    wait_event(plog, "rules_loaded", 60, where=lambda e: e.get("source") == "pushed")
    # policy values outside their documented range never leave the operator's machine
    (tmp_path / "bad.yaml").write_text("version: 1\npolicy:\n  node_lost_s: 0.01\n"
                                       "  max_restarts: 1000000000\n")
    res = subprocess.run([*push[:-2], str(tmp_path / "bad.yaml")], env=site.env(),
                         capture_output=True, text=True, timeout=60)
    assert res.returncode == 3 and "bad.yaml:3: policy.node_lost_s" in res.stderr
    assert "bad.yaml:4: policy.max_restarts" in res.stderr


# ---- case 4 --------------------------------------------------------------------------------

def test_case4_a_decision_of_run_1_does_not_restart_run_2(kafka_bootstrap: str, site: Site,
                                                         cluster: tuple[str, Path],
                                                         tmp_path: Path) -> None:
    prefix, _ = cluster
    b, job = kafka_bootstrap, f"reused-{uuid.uuid4().hex[:6]}"
    err = ("RuntimeError: NCCL communicator was aborted on rank 3.  Original reason for failure "
           "was: NCCL error: unhandled system error")
    subprocess.run(agent_cmd(b, prefix, job, "NODE4", ["sh", "-c", f"echo '{err}' >&2; "
                                                          "exit 1"],
                             "--spool-dir", str(tmp_path / "s1"), *site.node_flags("NODE4")),
                   env=site.env(), capture_output=True, timeout=60)
    log2 = tmp_path / "run2.log"
    with open(log2, "wb") as fh:  # run 2 of the same job name, right after run 1 ended
        run2 = subprocess.Popen(agent_cmd(b, prefix, job, "NODE4",
                                          [sys.executable, "-c", FOREVER],
                                          "--follow-decisions", "--metrics-port", "0",
                                          "--spool-dir", str(tmp_path / "s2"),
                                          *site.node_flags("NODE4")),
                                stdout=fh, stderr=subprocess.STDOUT, env=site.env(),
                                start_new_session=True)
    try:
        wait_until(lambda: any(d["action"] == "restart" for d in decisions(b, prefix, job)),
                   60, "run 1's restart decision")
        # the follower read it (its look-back covers it) and refused it: another run
        wait_event(log2, "decision_refused", 30, where=lambda e: e.get("reason") == "other_run",
                   proc=run2)
        assert run2.poll() is None and b"event=restart " not in log2.read_bytes()
        assert refused_metric(log2).get(("decision", "other_run"), 0) >= 1
    finally:
        stop(run2)


class Hook(http.server.BaseHTTPRequestHandler):
    posted: list[bytes] = []

    def do_POST(self) -> None:  # noqa: N802
        Hook.posted.append(self.rfile.read(int(self.headers.get("Content-Length", 0))))
        self.send_response(200)
        self.end_headers()

    def log_message(self, *a: Any) -> None:
        pass


def test_case4_an_old_signed_decision_replayed_to_notify_is_not_posted(
        kafka_bootstrap: str, site: Site, tmp_path: Path) -> None:
    prefix = f"trustq{uuid.uuid4().hex[:8]}."
    srv = socketserver.TCPServer(("127.0.0.1", 0), Hook)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    signer = RecordSigner(read_signing_key(site.key("proc")), DECISION)
    topic = f"{prefix}decisions"
    produce(kafka_bootstrap, topic, b"x", [orjson.dumps(signer.sign_record(
        blacklist("warmup", "n0", "warm-1")))])  # the topic exists before notify starts
    log = tmp_path / "notify.log"
    with open(log, "wb") as fh:
        proc = subprocess.Popen(
            [faultwatch_exe(), "notify", "--bootstrap", kafka_bootstrap, "--topic-prefix",
             prefix, "--webhook", f"http://127.0.0.1:{srv.server_address[1]}/h",
             "--group-wait-s", "0.5", "--group-id", f"{prefix}notify", "--from-beginning",
             "--metrics-port", "0",
             *([] if OFF else ["--replay-state", str(tmp_path / "seen")])],
            stdout=fh, stderr=subprocess.STDOUT, env=site.env(), start_new_session=True)
    try:
        wait_until(lambda: b"notify_started" in log.read_bytes(), 60, "notify to start")
        old = signer.sign_record(blacklist("old-job", "n1", "old-1", ts=time.time() - 2400))
        new = signer.sign_record(blacklist("new-job", "n2", "new-1"))
        produce(kafka_bootstrap, topic, b"x", [orjson.dumps(old), orjson.dumps(new)])
        wait_until(lambda: any(b"new-job" in p for p in Hook.posted), 60, "the fresh decision")
        assert not any(b"old-job" in p for p in Hook.posted)
        e = wait_event(log, "decision_refused", 10, proc=proc)
        assert e["reason"] == "too_old"
        assert refused_metric(log).get(("decision", "too_old"), 0) >= 1
    finally:
        stop(proc)
        srv.shutdown()


# ---- case 5 --------------------------------------------------------------------------------

def test_case5_what_an_agent_holds_cannot_sign_a_blacklist(kafka_bootstrap: str, site: Site,
                                                           tmp_path: Path) -> None:
    prefix = f"trusth{uuid.uuid4().hex[:8]}."
    produce(kafka_bootstrap, f"{prefix}decisions", b"x", [b"{}"])
    act, drained, alog = start_actuate(kafka_bootstrap, prefix, site, tmp_path,
                                       {"job-a": "n-a", "job-b": "n-b", "job-c": "n-c"})
    try:
        node_key = RecordSigner(read_signing_key(site.key("GOODNODE")), DECISION)
        hmac_ring = Keyring((Key("k1", b"the-agents-shared-secret"),))
        proc_key = RecordSigner(read_signing_key(site.key("proc")), DECISION)
        produce(kafka_bootstrap, f"{prefix}decisions", b"x", [
            orjson.dumps(node_key.sign_record(blacklist("job-a", "n-a", "by-node-key"))),
            orjson.dumps(sign(blacklist("job-b", "n-b", "by-hmac"), hmac_ring)),
            orjson.dumps(proc_key.sign_record(blacklist("job-c", "n-c", "by-processor")))])
        wait_until(lambda: "n-c" in read(drained), 60, "the processor-signed blacklist")
        assert "n-a" not in read(drained) and "n-b" not in read(drained)
        reasons = {e["reason"] for e in events(alog, "decision_refused")}
        assert {"wrong_role", "malformed_signature"} <= reasons, reasons
        counted = refused_metric(alog)
        assert counted.get(("decision", "wrong_role"), 0) >= 1, counted
        assert counted.get(("decision", "malformed_signature"), 0) >= 1, counted
    finally:
        stop(act)
