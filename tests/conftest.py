"""Shared Kafka fixtures: one broker per test session, unique topics and groups per test.

Helpers (waiting, processes, topics, agents, harnesses) live in tests/support."""

from __future__ import annotations

import os
import shutil
import subprocess
import uuid
import warnings
from collections.abc import Generator, Iterator
from pathlib import Path
from urllib.parse import urlparse

import pytest

from tests.support.waiting import wait_until

# The tests read faultwatch's events (child_started, decision, probe ...) from the
# stderr of `run` and `agent`, whose default for a person is warnings only: every process a
# test starts writes them all (tests/unit/test_eventlog.py and test_calm_terminal.py check
# the defaults with this variable removed).
os.environ.setdefault("FAULTWATCH_LOG_LEVEL", "debug")

KAFKA_IMAGE = "apache/kafka:3.9.1"


def _docker_answers() -> bool:
    """True when a Docker engine answers within a few seconds (never raises)."""
    host = os.environ.get("DOCKER_HOST", "")
    if not host and not Path("/var/run/docker.sock").exists():
        return False
    docker = shutil.which("docker")
    if docker is None:
        return False
    try:
        proc = subprocess.run([docker, "info", "--format", "{{.ServerVersion}}"],
                              capture_output=True, timeout=5)
    except (OSError, subprocess.TimeoutExpired):
        return False
    return proc.returncode == 0


def _wait_for_broker(bootstrap: str, timeout: float = 60.0) -> None:
    import asyncio

    from aiokafka.admin import AIOKafkaAdminClient

    async def probe() -> bool:
        admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap, request_timeout_ms=5000)
        try:
            await admin.start()
            return bool((await admin.describe_cluster()).get("brokers"))
        finally:
            await admin.close()

    problem = ""

    def ready() -> bool:
        nonlocal problem
        try:
            if asyncio.run(probe()):
                return True
            problem = "metadata listed no broker"
        except Exception as exc:  # not up yet
            problem = f"{type(exc).__name__}: {exc}"
        return False

    wait_until(ready, timeout, f"the Kafka container at {bootstrap}", interval_s=0.5,
               detail=lambda: f"last problem: {problem}")


def _container_broker() -> Generator[str, None, None] | None:
    """A KRaft broker in Docker via testcontainers, or None when that is not available.

    testcontainers' KafkaContainer only knows Confluent images, so the official
    apache/kafka image runs as a generic container on a fixed host port (the advertised
    listener must name the port clients use).
    """
    try:
        from testcontainers.core.container import DockerContainer
    except ImportError:
        return None
    from faultwatch.kafka.broker import free_port

    port = free_port()
    docker_host = urlparse(os.environ.get("DOCKER_HOST", ""))
    remote = docker_host.scheme in ("tcp", "http", "https", "ssh") and docker_host.hostname
    host = docker_host.hostname if remote and docker_host.hostname else "localhost"
    env = {
        "KAFKA_NODE_ID": "1",
        "KAFKA_PROCESS_ROLES": "broker,controller",
        "KAFKA_LISTENERS": f"HOST://:{port},INTERNAL://:19092,CONTROLLER://:19093",
        "KAFKA_ADVERTISED_LISTENERS": f"HOST://{host}:{port},INTERNAL://localhost:19092",
        "KAFKA_LISTENER_SECURITY_PROTOCOL_MAP":
            "HOST:PLAINTEXT,INTERNAL:PLAINTEXT,CONTROLLER:PLAINTEXT",
        "KAFKA_INTER_BROKER_LISTENER_NAME": "INTERNAL",
        "KAFKA_CONTROLLER_LISTENER_NAMES": "CONTROLLER",
        "KAFKA_CONTROLLER_QUORUM_VOTERS": "1@localhost:19093",
        "KAFKA_NUM_PARTITIONS": "1",
        "KAFKA_OFFSETS_TOPIC_REPLICATION_FACTOR": "1",
        "KAFKA_OFFSETS_TOPIC_NUM_PARTITIONS": "1",
        "KAFKA_TRANSACTION_STATE_LOG_REPLICATION_FACTOR": "1",
        "KAFKA_TRANSACTION_STATE_LOG_MIN_ISR": "1",
        "KAFKA_GROUP_INITIAL_REBALANCE_DELAY_MS": "0",
        "KAFKA_AUTO_CREATE_TOPICS_ENABLE": "true",
    }

    def run() -> Generator[str, None, None]:
        container = DockerContainer(KAFKA_IMAGE).with_bind_ports(port, port)
        for key, value in env.items():
            container = container.with_env(key, value)
        with container:
            bootstrap = f"{host}:{port}"
            _wait_for_broker(bootstrap)
            yield bootstrap

    return run()


# Under pytest-xdist (scripts/test.sh runs `-n 3 --dist loadfile`) every worker is its own
# session: one broker per worker would cost a JVM each. The workers share one local broker
# instead, in a directory beside their base temps (the run's base temp, which xdist makes the
# parent of each worker's). broker.up() serialises on a lock in that directory and finds a
# broker already running there, so the first worker that needs Kafka starts it and the others
# join it; the controller stops it when the run ends (pytest_sessionfinish below).
SHARED_BROKER_DIR = "kafka-shared"


def _xdist_worker() -> bool:
    return bool(os.environ.get("PYTEST_XDIST_WORKER"))


def pytest_sessionfinish(session: pytest.Session) -> None:
    """The xdist controller stops the broker its workers shared (no-op elsewhere)."""
    config = session.config
    if hasattr(config, "workerinput") or not hasattr(config, "_tmp_path_factory"):
        return
    if not config.pluginmanager.hasplugin("dsession"):  # xdist is not distributing this run
        return
    data = config._tmp_path_factory.getbasetemp() / SHARED_BROKER_DIR
    if data.is_dir():
        from faultwatch.kafka import broker as kafka_broker

        kafka_broker.down(data)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Under xdist, files with the most `slow` tests first (ties in collection order).

    Workers take one file at a time (--dist loadfile --no-loadscope-reorder) as they free up:
    starting the long files first keeps one of them from running alone at the end while the
    other workers idle. A serial run keeps the collection order."""
    if not _xdist_worker():
        return
    def file_of(item: pytest.Item) -> str:
        return item.nodeid.split("::", 1)[0]

    slow: dict[str, int] = {}
    for item in items:
        slow[file_of(item)] = slow.get(file_of(item), 0) + (item.get_closest_marker("slow")
                                                            is not None)
    rank = {f: i for i, f in enumerate(sorted(slow, key=lambda f: -slow[f]))}
    items.sort(key=lambda item: rank[file_of(item)])


@pytest.fixture(scope="session")
def kafka_bootstrap(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """Bootstrap address of a real Kafka broker shared by the session.

    In order: $FAULTWATCH_BOOTSTRAP; under pytest-xdist, one local broker shared by all
    workers; a testcontainers broker (apache/kafka:3.9.1) when a Docker engine answers; else a
    local broker from Maven Central jars on a free port.
    """
    external = os.environ.get("FAULTWATCH_BOOTSTRAP", "").strip()
    if external:
        yield external
        return
    from faultwatch.kafka import broker as kafka_broker

    if _xdist_worker():
        shared = tmp_path_factory.getbasetemp().parent / SHARED_BROKER_DIR
        yield kafka_broker.up(port=kafka_broker.free_port(), data_dir=shared)
        return  # the controller stops it once every worker is done
    container = _container_broker() if _docker_answers() else None
    if container is not None:
        try:
            bootstrap = next(container)
        except Exception as exc:  # pull/start failed: fall back to the local jars
            warnings.warn(f"Kafka container did not start ({exc}); using local jars", stacklevel=1)
        else:
            try:
                yield bootstrap
            finally:
                container.close()
            return
    data_dir = tmp_path_factory.mktemp("kafka")
    bootstrap = kafka_broker.up(port=kafka_broker.free_port(), data_dir=data_dir)
    try:
        yield bootstrap
    finally:
        kafka_broker.down(data_dir)


@pytest.fixture
def topic_prefix() -> str:
    """A prefix unique to this test (`t<hex8>.`), so each test works on its own topics."""
    return f"t{uuid.uuid4().hex[:8]}."


@pytest.fixture
def group_id() -> str:
    """A consumer group id unique to this test."""
    return f"g{uuid.uuid4().hex[:8]}"


@pytest.fixture
def own_broker(tmp_path: Path) -> Iterator[tuple[str, Path, int]]:
    """A broker of this test's own (outages, restarts): (bootstrap, data dir, port)."""
    from faultwatch.kafka import broker as kafka_broker

    port = kafka_broker.free_port()
    data = tmp_path / "kafka"
    bootstrap = kafka_broker.up(port=port, data_dir=data)
    try:
        yield bootstrap, data, port
    finally:
        kafka_broker.down(data, port)
