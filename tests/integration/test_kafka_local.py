"""The Docker-free local Kafka broker: start, persist across restarts, stop, CLI output."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition

from faultwatch.errors import EXIT_BROKER
from faultwatch.kafka import broker as kafka_broker

# No skip when java/mvn are missing: scripts/bootstrap.sh requires them, and a broker test
# that silently skips would hide a broken install.
pytestmark = [pytest.mark.kafka]

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture
def broker_dir(tmp_path: Path) -> Iterator[Path]:
    """A fresh data dir; whatever broker a test leaves running there is stopped."""
    data = tmp_path / "broker"
    yield data
    kafka_broker.down(data)


async def _produce(bootstrap: str, topic: str, value: bytes) -> None:
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, acks="all")
    await producer.start()
    try:
        await producer.send_and_wait(topic, value, key=b"k")
    finally:
        await producer.stop()


async def _read_all(bootstrap: str, topic: str) -> list[bytes]:
    consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap, group_id=None,
                                auto_offset_reset="earliest", enable_auto_commit=False)
    await consumer.start()
    try:
        tp = TopicPartition(topic, 0)
        consumer.assign([tp])
        await consumer.seek_to_beginning(tp)
        end = (await consumer.end_offsets([tp]))[tp]
        values: list[bytes] = []
        while await consumer.position(tp) < end:
            batch = await consumer.getmany(tp, timeout_ms=5000)
            values += [rec.value for rec in batch.get(tp, []) if rec.value is not None]
        return values
    finally:
        await consumer.stop()


def test_data_survives_restart_and_status_follows(broker_dir: Path) -> None:
    port = kafka_broker.free_port()
    bootstrap = kafka_broker.up(port=port, data_dir=broker_dir)
    assert bootstrap == f"127.0.0.1:{port}"
    first = kafka_broker.status(broker_dir)
    assert first["running"] and first["bootstrap"] == bootstrap

    # A second `up` on the running data dir returns the same broker.
    assert kafka_broker.up(port=port, data_dir=broker_dir) == bootstrap
    assert kafka_broker.status(broker_dir)["pid"] == first["pid"]

    asyncio.run(_produce(bootstrap, "persist", b"hello across restarts"))
    assert kafka_broker.down(broker_dir) is True
    assert kafka_broker.status(broker_dir)["running"] is False
    assert not (broker_dir / kafka_broker.PID_FILE).exists()

    assert kafka_broker.up(port=port, data_dir=broker_dir) == bootstrap
    assert asyncio.run(_read_all(bootstrap, "persist")) == [b"hello across restarts"]
    again = kafka_broker.status(broker_dir)
    assert again == {"running": True, "pid": again["pid"], "bootstrap": bootstrap,
                     "data_dir": str(broker_dir.resolve()), "listening": True}
    assert again["pid"] != first["pid"]

    assert kafka_broker.down(broker_dir) is True
    assert kafka_broker.status(broker_dir) == {"running": False, "pid": None, "bootstrap": None,
                                              "data_dir": str(broker_dir.resolve()),
                                              "listening": False}
    assert kafka_broker.down(broker_dir) is False


def test_up_refuses_a_busy_port(broker_dir: Path) -> None:
    import socket

    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        with pytest.raises(kafka_broker.BrokerError, match=f"port {port}"):
            kafka_broker.up(port=port, data_dir=broker_dir)
    assert kafka_broker.status(broker_dir)["running"] is False


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    return subprocess.run([sys.executable, "-m", "faultwatch", "kafka", *args], cwd=REPO,
                          env=env, capture_output=True, text=True, timeout=180)


def test_cli_prints_exactly_the_bootstrap_address(broker_dir: Path) -> None:
    port = kafka_broker.free_port()
    where = ["--port", str(port), "--data-dir", str(broker_dir)]

    started = _cli("up", *where)
    assert started.returncode == 0, started.stderr
    assert started.stdout == f"127.0.0.1:{port}\n"

    shown = _cli("status", "--json", *where)
    assert shown.returncode == 0, shown.stderr
    info = json.loads(shown.stdout)
    assert info["running"] is True and info["bootstrap"] == f"127.0.0.1:{port}"
    assert "running: pid" in _cli("status", *where).stdout
    # asked by port alone (issue 36 item 9): the broker listening there, wherever its data
    by_port = _cli("status", "--port", str(port))
    assert by_port.returncode == 0 and f"data dir {broker_dir.resolve()}" in by_port.stdout, \
        by_port

    stopped = _cli("down", "--port", str(port))  # and stopped by port alone too
    assert stopped.returncode == 0 and str(broker_dir.resolve()) in stopped.stdout, stopped
    assert json.loads(_cli("status", "--json", *where).stdout)["running"] is False
    gone = _cli("status", "--port", str(port))
    assert gone.returncode == 1 and "not running: nothing listens" in gone.stdout, gone


def test_status_by_port_reports_any_listener(tmp_path: Path) -> None:
    import socket

    with socket.socket() as other:  # not a broker faultwatch started: said so, not "not running"
        other.bind(("127.0.0.1", 0))
        other.listen()
        port = other.getsockname()[1]
        shown = _cli("status", "--port", str(port))
        assert shown.returncode == 0 and shown.stdout.startswith("listening: "), shown
        assert json.loads(_cli("status", "--port", str(port), "--json").stdout)[
            "listening"] is True


def test_cli_reports_errors_on_stderr(tmp_path: Path) -> None:
    failed = _cli("up", "--port", "70000", "--data-dir", str(tmp_path / "x"))
    assert failed.returncode == EXIT_BROKER
    assert failed.stdout == ""
    assert failed.stderr.startswith("faultwatch: error: ")
