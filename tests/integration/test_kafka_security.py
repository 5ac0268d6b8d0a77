"""Kafka security against a real broker with a SASL_SSL listener: TLS, PLAIN and SCRAM users."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition

from faultwatch.errors import BrokerAuthError, BrokerError
from faultwatch.kafka import broker as kafka_broker
from faultwatch.kafka import settings as kafka_settings
from faultwatch.kafka.errors import diagnose
from faultwatch.kafka.settings import KafkaSecurity
from faultwatch.wire import signing

pytestmark = [pytest.mark.kafka]

KEYSTORE_PASSWORD = "keystore-secret"
PLAIN_USERS = {"alice": "alice-secret"}
SCRAM_USERS = {"bob": "bob-secret"}


@dataclass(frozen=True)
class SecureBroker:
    plaintext: str
    sasl_ssl: str
    ca_file: Path


def _openssl(*args: str, cwd: Path) -> None:
    proc = subprocess.run(["openssl", *args], cwd=cwd, capture_output=True, text=True,
                          timeout=60)
    assert proc.returncode == 0, proc.stderr


def make_certificates(d: Path) -> tuple[Path, Path]:
    """A CA and a broker certificate for 127.0.0.1 signed by it: (ca.pem, broker.p12)."""
    _openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2",
             "-keyout", "ca.key", "-out", "ca.pem", "-subj", "/CN=faultwatch test CA",
             "-addext", "basicConstraints=critical,CA:TRUE",
             "-addext", "keyUsage=critical,keyCertSign,cRLSign", cwd=d)
    _openssl("req", "-newkey", "rsa:2048", "-nodes", "-keyout", "broker.key",
             "-out", "broker.csr", "-subj", "/CN=127.0.0.1", cwd=d)
    (d / "broker.ext").write_text(
        "subjectAltName=IP:127.0.0.1,DNS:localhost\nbasicConstraints=CA:FALSE\n"
        "keyUsage=critical,digitalSignature,keyEncipherment\nextendedKeyUsage=serverAuth\n"
        "authorityKeyIdentifier=keyid\n")
    _openssl("x509", "-req", "-in", "broker.csr", "-CA", "ca.pem", "-CAkey", "ca.key",
             "-CAcreateserial", "-days", "2", "-out", "broker.pem", "-extfile", "broker.ext",
             cwd=d)
    _openssl("pkcs12", "-export", "-in", "broker.pem", "-inkey", "broker.key",
             "-certfile", "ca.pem", "-name", "broker", "-out", "broker.p12",
             "-passout", f"pass:{KEYSTORE_PASSWORD}", cwd=d)
    return d / "ca.pem", d / "broker.p12"


@pytest.fixture(scope="module")
def secure_broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SecureBroker]:
    certs = tmp_path_factory.mktemp("certs")
    ca, keystore = make_certificates(certs)
    data = tmp_path_factory.mktemp("secure-broker")
    sport = kafka_broker.free_port()
    listener = kafka_broker.SecureListener(port=sport, keystore=keystore,
                                          keystore_password=KEYSTORE_PASSWORD,
                                          plain_users=PLAIN_USERS, scram_users=SCRAM_USERS)
    bootstrap = kafka_broker.up(port=kafka_broker.free_port(), data_dir=data, secure=listener)
    try:
        yield SecureBroker(bootstrap, f"{kafka_broker.HOST}:{sport}", ca)
    finally:
        kafka_broker.down(data)


async def _round_trip(bootstrap: str, sec: KafkaSecurity) -> list[bytes]:
    topic = f"t{uuid.uuid4().hex[:8]}.secure"
    value = uuid.uuid4().hex.encode()
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, acks="all",
                                request_timeout_ms=15000, **sec.client_kwargs())
    try:
        await asyncio.wait_for(producer.start(), 30)
        await asyncio.wait_for(producer.send_and_wait(topic, value, key=b"k"), 30)
    finally:
        await producer.stop()
    consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap, group_id=None,
                                enable_auto_commit=False, **sec.client_kwargs())
    await asyncio.wait_for(consumer.start(), 30)
    try:
        tp = TopicPartition(topic, 0)
        consumer.assign([tp])
        await consumer.seek_to_beginning(tp)
        batch = await consumer.getmany(tp, timeout_ms=10000)
        return [r.value for r in batch.get(tp, [])]
    finally:
        await consumer.stop()


async def _read(bootstrap: str, sec: KafkaSecurity, topic: str) -> list[bytes]:
    consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap, group_id=None,
                                enable_auto_commit=False, **sec.client_kwargs())
    await asyncio.wait_for(consumer.start(), 30)
    try:
        await consumer._client.force_metadata_update()  # noqa: SLF001 - as the agent does
        parts = sorted(consumer.partitions_for_topic(topic) or ())
        assert parts, f"{topic} has no partitions"
        tps = [TopicPartition(topic, p) for p in parts]
        consumer.assign(tps)
        await consumer.seek_to_beginning(*tps)
        ends = await consumer.end_offsets(tps)
        out: list[bytes] = []
        async def behind() -> bool:
            return any([await consumer.position(tp) < ends[tp] for tp in tps])

        while await behind():
            batch = await consumer.getmany(timeout_ms=5000)
            out += [r.value for recs in batch.values() for r in recs]
        return out
    finally:
        await consumer.stop()


def _env(broker: SecureBroker, user: str, password: str, mechanism: str) -> dict[str, str]:
    return {"FAULTWATCH_KAFKA_SECURITY_PROTOCOL": "SASL_SSL",
            "FAULTWATCH_KAFKA_SASL_MECHANISM": mechanism,
            "FAULTWATCH_KAFKA_USERNAME": user, "FAULTWATCH_KAFKA_PASSWORD": password,
            "FAULTWATCH_KAFKA_CA_FILE": str(broker.ca_file)}


@pytest.mark.parametrize("user,mechanism", [("alice", "PLAIN"), ("bob", "SCRAM-SHA-256"),
                                            ("bob", "SCRAM-SHA-512")])
def test_the_right_password_produces_and_consumes_over_sasl_ssl(
        secure_broker: SecureBroker, user: str, mechanism: str) -> None:
    password = {**PLAIN_USERS, **SCRAM_USERS}[user]
    sec = kafka_settings.from_sources(env=_env(secure_broker, user, password, mechanism))
    values = asyncio.run(_round_trip(secure_broker.sasl_ssl, sec))
    assert len(values) == 1 and len(values[0]) == 32


def test_a_password_file_from_the_config_file_works(secure_broker: SecureBroker,
                                                    tmp_path: Path) -> None:
    (tmp_path / "pw").write_text("alice-secret\n")
    cfg = tmp_path / "kafka.yaml"
    cfg.write_text(f"kafka:\n  security_protocol: SASL_SSL\n  sasl_mechanism: PLAIN\n"
                   f"  username: alice\n  password_file: pw\n  ca_file: {secure_broker.ca_file}\n")
    sec = kafka_settings.from_sources(env={"FAULTWATCH_KAFKA_CONFIG": str(cfg)})
    assert len(asyncio.run(_round_trip(secure_broker.sasl_ssl, sec))) == 1


@pytest.mark.parametrize("user,mechanism", [("alice", "PLAIN"), ("bob", "SCRAM-SHA-256")])
def test_a_wrong_password_is_refused_with_a_clear_error(
        secure_broker: SecureBroker, user: str, mechanism: str) -> None:
    sec = kafka_settings.from_sources(env=_env(secure_broker, user, "wrong", mechanism))
    kafka_settings.configure(sec)
    try:
        with pytest.raises(Exception) as info:
            asyncio.run(asyncio.wait_for(_round_trip(secure_broker.sasl_ssl, sec), 60))
        err = asyncio.run(diagnose(info.value, secure_broker.sasl_ssl,
                                                  "producing"))
    finally:
        kafka_settings.configure(KafkaSecurity())
    assert not isinstance(info.value, TimeoutError), "a wrong password must fail, not hang"
    assert isinstance(err, BrokerAuthError)
    assert "authentication failed" in str(err), str(err)
    assert f"user={user} mechanism={mechanism}" in str(err)
    assert "wrong" not in str(err)  # the password is never printed


def test_an_untrusted_broker_certificate_is_refused(secure_broker: SecureBroker,
                                                   tmp_path: Path) -> None:
    other_ca, _ = make_certificates(tmp_path)  # a CA that did not sign the broker
    env = {**_env(secure_broker, "alice", "alice-secret", "PLAIN"),
           "FAULTWATCH_KAFKA_CA_FILE": str(other_ca)}
    sec = kafka_settings.from_sources(env=env)
    with pytest.raises(Exception) as info:
        asyncio.run(asyncio.wait_for(_round_trip(secure_broker.sasl_ssl, sec), 60))
    assert not isinstance(info.value, TimeoutError)
    kafka_settings.configure(sec)
    try:
        err = asyncio.run(diagnose(info.value, secure_broker.sasl_ssl, "reading"))
    finally:
        kafka_settings.configure(KafkaSecurity())
    assert "TLS/SASL handshake failed" in str(err), str(err)


def test_the_plaintext_listener_still_serves_plain_clients(secure_broker: SecureBroker,
                                                          tmp_path: Path) -> None:
    assert len(asyncio.run(_round_trip(secure_broker.plaintext, KafkaSecurity()))) == 1
    with pytest.raises(BrokerError, match="SASL_SSL port"):
        kafka_broker.up(port=kafka_broker.free_port(), data_dir=tmp_path / "other",
                       secure=kafka_broker.SecureListener(
                           port=int(secure_broker.sasl_ssl.rsplit(":", 1)[1]),
                           keystore=Path("x"), keystore_password="x"))


def _cli_env(broker: SecureBroker, user: str, password: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("FAULTWATCH_KAFKA_")}
    return {**env, **_env(broker, user, password, "PLAIN"),
            "FAULTWATCH_BOOTSTRAP": broker.sasl_ssl}


def test_an_agent_ships_over_sasl_ssl_and_a_reader_reads_it_back(
        secure_broker: SecureBroker, tmp_path: Path) -> None:
    prefix = f"t{uuid.uuid4().hex[:8]}."
    env = _cli_env(secure_broker, "alice", "alice-secret")
    agent = subprocess.run(
        [sys.executable, "-m", "faultwatch", "agent", "--job", "secure-job", "--node", "n1",
         "--topic-prefix", prefix, "--spool-dir", str(tmp_path), "--no-follow-decisions",
         "--", sys.executable, "-c", "print('hello over tls')"],
        env=env, capture_output=True, timeout=120)
    assert agent.returncode == 0, agent.stderr.decode()[-3000:]
    logs = subprocess.run([sys.executable, "-m", "faultwatch", "logs", "secure-job",
                           "--topic-prefix", prefix], env=env, capture_output=True, timeout=120)
    assert logs.returncode == 0, logs.stderr.decode()[-3000:]
    assert b"hello over tls" in logs.stdout


def test_a_reader_with_a_wrong_password_exits_with_a_clear_error(
        secure_broker: SecureBroker) -> None:
    env = _cli_env(secure_broker, "alice", "not-her-password")
    out = subprocess.run([sys.executable, "-m", "faultwatch", "decisions",
                          "--topic-prefix", "t-none."], env=env, capture_output=True,
                         timeout=120)
    err = out.stderr.decode()
    assert out.returncode == 5, err[-3000:]  # EXIT_BROKER
    assert "faultwatch: error: reading t-none.decisions at" in err
    assert "authentication failed (protocol=SASL_SSL user=alice mechanism=PLAIN)" in err
    assert "Traceback" not in err and "not-her-password" not in err


def test_an_agent_with_a_wrong_password_says_so_and_keeps_its_lines(
        secure_broker: SecureBroker, tmp_path: Path) -> None:
    env = _cli_env(secure_broker, "alice", "not-her-password")
    agent = subprocess.run(
        [sys.executable, "-m", "faultwatch", "agent", "--job", "refused", "--node", "n1",
         "--spool-dir", str(tmp_path), "--no-follow-decisions", "--exit-flush-timeout-s", "3",
         "--", sys.executable, "-c", "print('kept')"],
        env=env, capture_output=True, timeout=120)
    err = agent.stderr.decode()
    assert agent.stdout == b"kept\n"  # the job itself is never hurt
    assert err.count("event=broker_refused") == 1, err[-3000:]
    assert "authentication failed" in err and "not-her-password" not in err


def test_the_processor_decides_over_sasl_ssl_and_signs(secure_broker: SecureBroker,
                                                       tmp_path: Path) -> None:
    prefix = f"t{uuid.uuid4().hex[:8]}."
    env = {**_cli_env(secure_broker, "alice", "alice-secret"),
           "FAULTWATCH_DECISION_KEY": "k1:processor-test-secret-01234"}
    fw = [sys.executable, "-m", "faultwatch"]
    proc = subprocess.Popen([*fw, "process", "--topic-prefix", prefix, "--settle-s", "0.5",
                             "--app-id", f"fw-{prefix}"], env=env,
                            stdout=subprocess.DEVNULL, stderr=open(tmp_path / "p.log", "wb"))
    try:
        crash = "import sys; print('RuntimeError: CUDA error: an illegal memory access', " \
                "file=sys.stderr, flush=True); sys.exit(1)"
        agent = subprocess.run(
            [*fw, "agent", "--job", "secure-crash", "--node", "n1", "--topic-prefix", prefix,
             "--spool-dir", str(tmp_path / "spool"), "--follow-decisions",
             "--decision-wait-s", "90", "--", sys.executable, "-c", crash],
            env=env, capture_output=True, timeout=180)
        err = agent.stderr.decode()
        assert "event=decision_refused" not in err, err[-3000:]
        assert "event=decisions_unverified" not in err
        out = subprocess.run([*fw, "decisions", "--topic-prefix", prefix, "--json"], env=env,
                             capture_output=True, timeout=120)
        assert out.returncode == 0, out.stderr.decode()[-2000:]
        decisions = [json.loads(line) for line in out.stdout.splitlines() if line.strip()]
        assert decisions, (tmp_path / "p.log").read_text()[-3000:] + err[-3000:]
        assert all(d["job"] == "secure-crash" for d in decisions)
        sec = kafka_settings.from_sources(env=env)
        raw = [json.loads(v) for v in asyncio.run(_read(secure_broker.sasl_ssl, sec,
                                                        f"{prefix}decisions"))]
        ring = signing.parse_keys(env["FAULTWATCH_DECISION_KEY"], "test")
        assert [signing.verify(d, ring).reason for d in raw] == ["signed"] * len(decisions)
        assert "component=agent event=decision " in err, err[-3000:]  # accepted, acted on
    finally:
        proc.terminate()
        proc.wait(timeout=60)
