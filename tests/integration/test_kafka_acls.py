"""Per-role ACLs on the locked-down local broker (`faultwatch kafka up --secure`, issue 28):
each role may do what docs/operating.md's table says and nothing else, an anonymous client
writes nothing on any listener, no password shows in any process's argv, and a real
processor and agent work end to end with their roles' client files. One broker per module."""

from __future__ import annotations

import asyncio
import contextlib
import json
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition

from faultwatch.agents.config import EXIT_BLACKLISTED
from faultwatch.kafka import acl_admin, acls, secure_broker
from faultwatch.kafka import broker as kafka_local
from faultwatch.kafka.secure_broker import SecureBroker
from faultwatch.kafka.settings import KafkaSecurity
from tests.support.cluster import events, processor, wait_event
from tests.support.processes import faultwatch_exe, job_env
from tests.support.waiting import wait_until

pytestmark = [pytest.mark.kafka]

PREFIX = "fwacl."
# runs a few seconds first (a status snapshot is published for a job active >= 3 s), then
# a hardware line: the processor blacklists the node (and writes the registry); the agent
# stops the child on that decision
XID = ("import time\nprint('step 1', flush=True)\ntime.sleep(5)\n"
       "print('NVRM: Xid (PCI:0000:3b:00): 79, pid=1, GPU has fallen off the bus.', "
       "flush=True)\ntime.sleep(60)\n")


@dataclass(frozen=True)
class Started:
    broker: SecureBroker
    stdout: str
    stderr: str
    argvs: list[str]  # every command line seen on the machine while it started


def _watch_argv(seen: list[str], stop: threading.Event) -> None:
    """Collect the command line of every process, every few ms, until `stop`."""
    while not stop.is_set():
        for proc in Path("/proc").iterdir():
            if proc.name.isdigit():
                with contextlib.suppress(OSError):
                    raw = (proc / "cmdline").read_bytes()
                    if raw:
                        seen.append(raw.replace(b"\0", b" ").decode("utf-8", "replace"))
        time.sleep(0.005)


@pytest.fixture(scope="module")
def started(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Started]:
    data = tmp_path_factory.mktemp("secure-broker")
    port = kafka_local.free_port()
    seen: list[str] = []
    stop = threading.Event()
    watcher = threading.Thread(target=_watch_argv, args=(seen, stop), daemon=True)
    watcher.start()
    try:
        out = subprocess.run([faultwatch_exe(), "kafka", "up", "--secure", "--data-dir",
                              str(data), "--port", str(port), "--topic-prefix", PREFIX],
                             capture_output=True, text=True, timeout=240, env=job_env())
    finally:
        stop.set()
        watcher.join()
    try:
        assert out.returncode == 0, out.stderr[-3000:]
        broker = SecureBroker(out.stdout.splitlines()[-1].strip(), data,
                              secure_broker.clients_of(data), data / "clients" / "ca.pem")
        yield Started(broker, out.stdout, out.stderr, seen)
    finally:
        kafka_local.down(data)


@pytest.fixture(scope="module")
def broker(started: Started) -> SecureBroker:
    return started.broker


def _listener_ports(data: Path) -> dict[str, int]:
    props = kafka_local._props(data)  # noqa: SLF001
    return {name.split("://")[0]: int(name.rsplit(":", 1)[1])
            for name in props["listeners"].split(",")}


async def _produce(bootstrap: str, kw: dict[str, object], topic: str, value: bytes,
                   timeout_s: float = 20.0) -> str:
    """'ok' or the name of the error a producer got writing one keyed record."""
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, request_timeout_ms=10000, **kw)
    try:
        await asyncio.wait_for(producer.start(), timeout_s)
        await asyncio.wait_for(producer.send_and_wait(topic, value, key=b"k"), timeout_s)
        return "ok"
    except Exception as e:  # noqa: BLE001 - the error is the answer
        return type(e).__name__
    finally:
        with contextlib.suppress(Exception):
            await producer.stop()


def produce(broker: SecureBroker, role: str, topic: str) -> str:
    value = f"{role}-{uuid.uuid4().hex}".encode()
    return asyncio.run(_produce(broker.bootstrap, broker.security(role).client_kwargs(),
                                topic, value))


async def _values(bootstrap: str, sec: KafkaSecurity, topic: str) -> list[bytes]:
    consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap, group_id=None,
                                enable_auto_commit=False, **sec.client_kwargs())
    await asyncio.wait_for(consumer.start(), 30)
    try:
        await consumer._client.force_metadata_update()  # noqa: SLF001
        tps = [TopicPartition(topic, p) for p in sorted(consumer.partitions_for_topic(topic)
                                                        or ())]
        assert tps, f"{topic} has no partitions"
        consumer.assign(tps)
        await consumer.seek_to_beginning(*tps)
        ends = await consumer.end_offsets(tps)
        out: list[bytes] = []
        while any([await consumer.position(tp) < ends[tp] for tp in tps]):
            batch = await consumer.getmany(timeout_ms=5000)
            out += [r.value for recs in batch.values() for r in recs if r.value is not None]
        return out
    finally:
        await consumer.stop()


def values(broker: SecureBroker, topic: str) -> list[bytes]:
    return asyncio.run(_values(broker.bootstrap, broker.security("admin"), topic))


def test_up_prints_the_secure_bootstrap_last_and_writes_one_client_file_per_role(
        started: Started) -> None:
    broker = started.broker
    ports = _listener_ports(broker.data_dir)
    assert broker.bootstrap == f"127.0.0.1:{ports['CLIENTS']}"
    assert set(ports) == {"CLIENTS", "INTERNAL", "CONTROLLER"}  # no PLAINTEXT listener
    props = kafka_local._props(broker.data_dir)  # noqa: SLF001
    assert set(props["listener.security.protocol.map"].split(",")) == {
        "CLIENTS:SASL_SSL", "INTERNAL:SASL_PLAINTEXT", "CONTROLLER:SASL_PLAINTEXT"}
    assert props["authorizer.class.name"].endswith("StandardAuthorizer")
    assert props["allow.everyone.if.no.acl.found"] == "false"
    assert props["super.users"] == f"User:{secure_broker.BROKER_USER}"
    passwords = set()
    for role in acls.ROLES:
        sec = broker.security(role)
        assert (sec.security_protocol, sec.sasl_mechanism, sec.username) == (
            "SASL_SSL", "SCRAM-SHA-512", f"faultwatch-{role}")
        pw = broker.data_dir / "clients" / f"{role}.password"
        assert pw.stat().st_mode & 0o777 == 0o600
        passwords.add(pw.read_text())
        assert str(pw) not in started.stdout and pw.read_text().strip() not in started.stdout
    assert len(passwords) == len(acls.ROLES)  # distinct generated passwords
    assert (broker.data_dir / kafka_local.PROPS_FILE).stat().st_mode & 0o777 == 0o600


def test_no_password_appears_in_any_argv_while_it_starts(started: Started) -> None:
    data = started.broker.data_dir
    # positive control: the watcher saw the storage being formatted and the broker starting
    assert any("StorageTool format" in a and str(data) in a for a in started.argvs)
    assert any("kafka.Kafka" in a and str(data) in a for a in started.argvs)
    secrets = [(data / "clients" / f"{r}.password").read_text().strip() for r in acls.ROLES]
    secrets.append((data / "secure" / "broker.password").read_text().strip())
    leaked = [a for a in set(started.argvs) for s in secrets if s in a]
    assert leaked == []
    said = started.stdout + started.stderr + (data / kafka_local.LOG_FILE).read_text()
    assert [s for s in secrets if s in said] == []  # nor in what it printed or logged
    # the SCRAM users went in through the argument file
    assert any("StorageTool format" in a and f"@{data}" in a for a in started.argvs)
    assert not (data / "format.args").exists()  # the argument file is gone after formatting


@pytest.mark.parametrize("role,topic", [
    ("agent", "decisions"), ("agent", "rules"), ("agent", "nodes"), ("agent", "signals"),
    ("agent", "status"), ("actuator", "logs"), ("actuator", "decisions"),
    ("actuator", "nodes"), ("processor", "rules"), ("processor", "logs"),
    ("agent", "incidents"), ("actuator", "incidents"), ("processor", "acted"),
    ("agent", "acted")])
def test_a_role_cannot_write_what_it_does_not_own(broker: SecureBroker, role: str,
                                                   topic: str) -> None:
    before = len(values(broker, PREFIX + topic))
    assert produce(broker, role, PREFIX + topic) == "TopicAuthorizationFailedError"
    assert len(values(broker, PREFIX + topic)) == before


@pytest.mark.parametrize("role,topic", [
    ("agent", "logs"), ("processor", "decisions"), ("processor", "signals"),
    ("processor", "status"), ("processor", "nodes"), ("processor", "deadletter"),
    ("processor", "incidents"), ("actuator", "acted"), ("admin", "rules"), ("admin", "nodes")])
def test_a_role_writes_what_it_owns(broker: SecureBroker, role: str, topic: str) -> None:
    before = len(values(broker, PREFIX + topic))
    assert produce(broker, role, PREFIX + topic) == "ok"
    assert len(values(broker, PREFIX + topic)) == before + 1


async def _create_topic(broker: SecureBroker, role: str, name: str) -> str:
    from aiokafka.admin import NewTopic
    from aiokafka.errors import for_code

    admin = await acl_admin.open_admin(broker.bootstrap, broker.security(role))
    try:
        resp = await admin.create_topics([NewTopic(name, num_partitions=1,
                                                   replication_factor=1)])
        code = resp.topic_errors[0][1]
        return "ok" if code == 0 else for_code(code).__name__
    finally:
        await admin.close()


def test_the_processor_creates_only_its_faust_topics(broker: SecureBroker) -> None:
    own = f"{PREFIX}processor-x{uuid.uuid4().hex[:6]}-changelog"
    assert asyncio.run(_create_topic(broker, "processor", own)) == "ok"  # positive control
    assert produce(broker, "processor", own) == "ok"
    made_up = f"{PREFIX}made-up-{uuid.uuid4().hex[:6]}"
    assert asyncio.run(_create_topic(broker, "processor", made_up)) == \
        "TopicAuthorizationFailedError"
    assert asyncio.run(_create_topic(broker, "agent", f"{PREFIX}processor-y-changelog")) == \
        "TopicAuthorizationFailedError"
    # nothing springs into being by writing to it (no auto-creation on this broker)
    assert produce(broker, "admin", f"{PREFIX}typo-{uuid.uuid4().hex[:6]}") != "ok"


def _anonymous_attempts(broker: SecureBroker) -> dict[str, str]:
    """Try to write one record as no one, on every listener, with every way in that needs
    no password: PLAINTEXT, TLS without SASL, and SASL with a made-up user."""
    ports = _listener_ports(broker.data_dir)
    ssl = KafkaSecurity("SSL", ca_file=broker.ca_file).client_kwargs()
    stranger = KafkaSecurity("SASL_PLAINTEXT", "PLAIN", "mallory", "guess").client_kwargs()
    stranger_tls = KafkaSecurity("SASL_SSL", "SCRAM-SHA-512", "mallory", "guess",
                                 ca_file=broker.ca_file).client_kwargs()
    tries: dict[str, tuple[int, dict[str, object]]] = {
        "clients/plaintext": (ports["CLIENTS"], {}),
        "clients/tls-only": (ports["CLIENTS"], ssl),
        "clients/unknown-user": (ports["CLIENTS"], stranger_tls),
        "internal/plaintext": (ports["INTERNAL"], {}),
        "internal/unknown-user": (ports["INTERNAL"], stranger),
        "controller/plaintext": (ports["CONTROLLER"], {}),
        "controller/unknown-user": (ports["CONTROLLER"], stranger),
    }

    async def attempt_all() -> dict[str, str]:
        got = await asyncio.gather(*(
            _produce(f"127.0.0.1:{port}", kw, f"{PREFIX}logs", b"anonymous", 15.0)
            for port, kw in tries.values()))
        return dict(zip(tries, got, strict=True))

    return asyncio.run(attempt_all())


def test_an_anonymous_client_writes_nothing_on_any_listener(broker: SecureBroker) -> None:
    results = _anonymous_attempts(broker)
    assert all(r != "ok" for r in results.values()), results
    assert produce(broker, "agent", f"{PREFIX}logs") == "ok"  # positive control, same run
    assert b"anonymous" not in values(broker, f"{PREFIX}logs")


def test_kafka_acls_applies_idempotently_and_reports_a_widened_acl(
        broker: SecureBroker) -> None:
    other = f"t{uuid.uuid4().hex[:8]}."
    admin_cfg = str(broker.clients["admin"])

    def acls_cli(*extra: str) -> subprocess.CompletedProcess[str]:
        res = subprocess.run([faultwatch_exe(), "kafka", "acls", "--topic-prefix", other,
                              "--bootstrap", broker.bootstrap, "--kafka-config", admin_cfg,
                              *extra], capture_output=True, text=True, timeout=120,
                             env=job_env())
        assert res.returncode == 0, res.stderr[-3000:]
        return res

    wanted = acls.table(acls.Scope(prefix=other))
    # the cluster and notify-group grants are shared with the module's prefix
    shared = [a for a in wanted if a.resource_type == "cluster" or a.name == acls.NOTIFY_GROUP]
    assert len(shared) == 4
    assert f"applied: {len(wanted) - 4} created, 4 already present, 0 extra" in \
        acls_cli("--apply").stdout
    assert f"applied: 0 created, {len(wanted)} already present, 0 extra" in \
        acls_cli("--apply").stdout
    assert produce(broker, "processor", other + "rules") == "TopicAuthorizationFailedError"
    assert produce(broker, "agent", other + "logs") == "ok"
    # an incident-time "quick fix": the processor may write rules now, and it shows
    widened = acls.Acl("User:faultwatch-processor", "topic", other + "rules", "literal",
                       "write")

    async def widen() -> None:
        admin = await acl_admin.open_admin(broker.bootstrap, broker.security("admin"))
        try:
            await acl_admin.create(admin, broker.bootstrap, [widened])
        finally:
            await admin.close()

    asyncio.run(widen())
    wait_until(lambda: produce(broker, "processor", other + "rules") == "ok", 30,
               "the widened ACL to take effect")
    out = acls_cli("--apply").stdout
    assert f"warning: User:faultwatch-processor holds an ACL beyond the role table: " \
           f"{widened.line()}" in out
    assert "1 extra" in out


def test_an_agent_cannot_apply_acls(broker: SecureBroker) -> None:
    res = subprocess.run([faultwatch_exe(), "kafka", "acls", "--topic-prefix", "evil.",
                          "--bootstrap", broker.bootstrap, "--kafka-config",
                          str(broker.clients["agent"]), "--apply"],
                         capture_output=True, text=True, timeout=120, env=job_env())
    assert res.returncode == 5, res.stderr[-2000:]  # EXIT_BROKER
    assert "not authorized" in res.stderr and "Traceback" not in res.stderr


def _cli(broker: SecureBroker, role: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([faultwatch_exe(), *args, "--bootstrap", broker.bootstrap,
                           "--topic-prefix", PREFIX, "--kafka-config", str(broker.clients[role])],
                          capture_output=True, text=True, timeout=120, env=job_env())


@pytest.mark.slow
def test_a_real_processor_decides_a_real_agents_job_with_their_roles(
        broker: SecureBroker, tmp_path: Path) -> None:
    job, node = f"acl-{uuid.uuid4().hex[:6]}", f"n-{uuid.uuid4().hex[:6]}"
    log = tmp_path / "processor.log"
    env = {k: v for k, v in job_env().items() if not k.startswith("FAULTWATCH_KAFKA_")}
    with processor(broker.bootstrap, PREFIX, log, "--partitions", "4", "--settle-s", "0.5",
                   env={**env, "FAULTWATCH_KAFKA_CONFIG": str(broker.clients["processor"])}
                   ) as proc:
        wait_event(log, "partitions_assigned", 120, lambda e: e.get("partitions") != "-",
                   proc=proc)
        agent = subprocess.run(
            [faultwatch_exe(), "agent", "--bootstrap", broker.bootstrap, "--topic-prefix",
             PREFIX, "--kafka-config", str(broker.clients["agent"]), "--job", job, "--node",
             node, "--heartbeat-s", "1", "--spool-dir", str(tmp_path / "spool"),
             "--follow-decisions", "--decision-wait-s", "90", "--", sys.executable, "-c", XID],
            capture_output=True, text=True, timeout=180, env=env)
        assert "event=broker_refused" not in agent.stderr, agent.stderr[-3000:]
        assert agent.returncode == EXIT_BLACKLISTED, agent.stderr[-3000:]
        assert "component=agent event=decision " in agent.stderr, \
            agent.stderr[-3000:] + log.read_text()[-3000:]
        # the actuator role reads the decision the processor wrote
        out = _cli(broker, "actuator", "decisions", "--job", job, "--json")
        assert out.returncode == 0, out.stderr[-3000:]
        decided = [json.loads(x) for x in out.stdout.splitlines() if x.strip()]
        assert [(d["action"], d["targets"]["nodes"]) for d in decided] == [("blacklist", [node])]
        # ... and what else it wrote with its role: the registry, a status snapshot and its
        # Faust changelog (read back by the admin role)
        wait_until(lambda: any(node.encode() in v for v in values(broker, PREFIX + "nodes")),
                   30, "the processor's registry record")
        wait_until(lambda: any(job.encode() in v for v in values(broker, PREFIX + "status")),
                   30, "the processor's status snapshot")
        assert values(broker, f"{PREFIX}processor-jobs-changelog")
        assert not [e for e in events(log, "broker_error")], log.read_text()[-3000:]
        assert "AuthorizationFailed" not in log.read_text()
        assert proc.poll() is None, log.read_text()[-3000:]
    # the operator (admin role) pushes rules; the processor could not (above)
    rules = tmp_path / "r.yaml"
    rules.write_text("version: 1\nrules:\n  - id: acl-test\n    category: retryable\n"
                     "    contains: 'acl test'\n    tests:\n      match:\n"
                     "        - 'an acl test line'\n")
    pushed = _cli(broker, "admin", "rules", "push", str(rules))
    assert pushed.returncode == 0, pushed.stderr[-3000:]
    denied = _cli(broker, "processor", "rules", "push", str(rules))
    assert denied.returncode == 5, denied.stderr[-2000:]  # EXIT_BROKER
    assert "not authorized (protocol=SASL_SSL user=faultwatch-processor" in denied.stderr


def test_kafka_acls_prints_the_table_without_a_broker() -> None:
    res = subprocess.run([faultwatch_exe(), "kafka", "acls", "--topic-prefix", "p.", "--json"],
                         capture_output=True, text=True, timeout=60,
                         env={**job_env(), "FAULTWATCH_BOOTSTRAP": ""})
    assert res.returncode == 0, res.stderr
    rows = [json.loads(x) for x in res.stdout.splitlines()]
    assert len(rows) == len(acls.table(acls.Scope(prefix="p.")))
    writes = {(r["principal"], r["name"]) for r in rows if r["operation"] == "write"}
    assert ("User:faultwatch-processor", "p.rules") not in writes
    assert ("User:faultwatch-admin", "p.rules") in writes


def test_up_secure_prints_no_cleartext_password_warning(started: Started,
                                                        caplog: pytest.LogCaptureFixture
                                                        ) -> None:
    """`kafka up --secure` printed aiokafka's "Sending username and password in the clear"
    8 times (issue 36 item 8): its own SASL_PLAINTEXT listeners are on 127.0.0.1, where
    nothing leaves the host. Positive control: a real handshake on that listener logs the
    warning once the filter is off."""
    import logging

    from aiokafka.conn import create_conn

    from faultwatch.kafka import clients

    assert clients.CLEARTEXT not in started.stderr + started.stdout
    plan = secure_broker.LockedDown(started.broker.data_dir)
    host, port = plan.internal_bootstrap().rsplit(":", 1)
    conn_log = logging.getLogger("aiokafka.conn")
    gate = next(f for f in conn_log.filters if isinstance(f, clients.CleartextWarning))

    async def handshake() -> None:
        conn = await create_conn(host, int(port), **plan.broker_security().client_kwargs())
        conn.close()

    with caplog.at_level(logging.WARNING, logger="aiokafka.conn"):
        asyncio.run(handshake())
        assert clients.CLEARTEXT not in caplog.text  # loopback: dropped
        conn_log.removeFilter(gate)
        try:
            asyncio.run(handshake())
        finally:
            conn_log.addFilter(gate)
    assert caplog.text.count(clients.CLEARTEXT) == 1, caplog.text
