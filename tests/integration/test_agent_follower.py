"""The decision follower against a real broker: no decision missed at any delay after the
run start, and a quiet, cheap back-off while the broker is down."""

from __future__ import annotations

import asyncio
import contextlib
import os
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from faultwatch import wire
from faultwatch.agents.config import EXIT_FAILED_BY_DECISION
from faultwatch.agents.decisions import DecisionFollower
from faultwatch.kafka import broker as kafka_broker
from tests.support.agents import RUN, agent_cmd, decision, publish

pytestmark = pytest.mark.kafka

# Fails at once on attempt 0 (a retryable crash at startup), succeeds on attempt 1.
FAIL_AT_ONCE = ("import os, sys\n"
                "a = os.environ['FAULTWATCH_ATTEMPT']\n"
                "print('attempt', a, flush=True)\n"
                "sys.exit(3 if a == '0' else 0)\n")

DELAYS_S = (0.0, 0.05, 0.1, 0.25, 0.5, 1.0, 2.0)
BROKER_LATENCY_S = 0.3


def publish_old(bootstrap: str, topic: str, age_s: float = 600.0) -> None:
    """An old decision of another job: the topic exists and holds history, like a real one."""
    from aiokafka import AIOKafkaProducer

    async def main() -> None:
        p = AIOKafkaProducer(bootstrap_servers=bootstrap)
        await p.start()
        try:
            await p.send_and_wait(topic, wire.encode_decision(decision("other-job", "fail", ())),
                                  key=b"other-job", timestamp_ms=int((time.time() - age_s) * 1000))
        finally:
            await p.stop()

    asyncio.run(main())


def slow_broker_consumer(**kw: Any) -> Any:
    """A real consumer whose offset lookups answer BROKER_LATENCY_S late (a loaded broker)."""
    from aiokafka import AIOKafkaConsumer

    class Slow(AIOKafkaConsumer):  # type: ignore[misc]
        async def offsets_for_times(self, *a: Any, **k: Any) -> Any:
            await asyncio.sleep(BROKER_LATENCY_S)
            return await super().offsets_for_times(*a, **k)

        async def end_offsets(self, *a: Any, **k: Any) -> Any:
            await asyncio.sleep(BROKER_LATENCY_S)
            return await super().end_offsets(*a, **k)

        async def beginning_offsets(self, *a: Any, **k: Any) -> Any:
            await asyncio.sleep(BROKER_LATENCY_S)
            return await super().beginning_offsets(*a, **k)

    return Slow(**kw)


def test_follower_with_a_slow_broker_misses_nothing_published_after_it_started(
        kafka_bootstrap: str, topic_prefix: str) -> None:
    """Decisions published at every delay after the follower started (while it positions
    itself against a slow broker, and after) all arrive. Today's follower looked up the
    offset by time, then the end offset: a decision landing in between was skipped."""
    topics = [f"{topic_prefix}{i}.decisions" for i in range(len(DELAYS_S))]
    for topic in topics:  # one topic per delay: an early decision must not help a later one
        publish_old(kafka_bootstrap, topic)

    async def one(producer: Any, i: int, delay: float) -> bool:
        job, topic = f"slow-{i}", topics[i]
        f = DecisionFollower(kafka_bootstrap, topic, job, lambda *a, **k: None,
                             consumer_factory=slow_broker_consumer)
        f.start()
        try:
            await asyncio.sleep(delay)
            await producer.send_and_wait(topic, wire.encode_decision(
                decision(job, "restart", ("n1",))), key=wire.job_key(job))
            return await f.get(20) is not None
        finally:
            await f.close()

    async def main() -> dict[float, bool]:
        from aiokafka import AIOKafkaProducer

        producer = AIOKafkaProducer(bootstrap_servers=kafka_bootstrap)
        await producer.start()
        try:
            got = await asyncio.gather(*(one(producer, i, d) for i, d in enumerate(DELAYS_S)))
        finally:
            await producer.stop()
        return dict(zip(DELAYS_S, got, strict=True))

    received = asyncio.run(main())
    missed = [d for d, ok in received.items() if not ok]
    assert not missed, f"missed the decisions published {missed} s after the start"


@pytest.mark.parametrize("fresh_topic", [False, True], ids=["topic-exists", "topic-created-late"])
def test_restart_decision_is_received_at_every_delay_after_the_run_start(
        kafka_bootstrap: str, topic_prefix: str, tmp_path: Path, fresh_topic: bool) -> None:
    """The child fails at once; the restart decision is published `delay` seconds after the
    child's first line (the run start is shipped before the child runs). Every agent must
    relaunch attempt 1, whatever the delay (today's follower missed 0.05-0.5 s)."""
    topic = f"{topic_prefix}decisions"
    if not fresh_topic:  # the processor created the topic long ago
        publish_old(kafka_bootstrap, topic)
    missed = []
    for i, delay in enumerate(DELAYS_S):
        job = f"follow-{i}"
        argv = agent_cmd(kafka_bootstrap, topic_prefix, tmp_path / job, job, sys.executable,
                         "-c", FAIL_AT_ONCE,
                         extra=("--follow-decisions", "--decision-wait-s", "20",
                                "--run-id", RUN))  # decisions act only on the run they name
        p = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        assert p.stdout is not None
        t0 = time.monotonic()
        time.sleep(max(0.0, delay - (time.monotonic() - t0)))
        publish(kafka_bootstrap, topic, decision(job, "restart", ("n1",)))
        out, err = p.communicate(timeout=60)
        if not (p.returncode == 0 and out.endswith(b"attempt 1\n")):
            missed.append((delay, p.returncode, err.decode()[-1500:]))
    assert not missed, missed


def _cpu_s(pid: int) -> float:
    """User + system CPU seconds of one process (not its children), from /proc."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")




def test_broker_down_the_follower_backs_off_quietly_and_recovers(
        own_broker: tuple[str, Path, int], topic_prefix: str, tmp_path: Path) -> None:
    """Broker stopped while the child runs: the agent uses a few % of a core and logs a few
    lines (one per state change, not per retry); when the broker is back a decision
    published then still stops the child (positive control: the follower recovered)."""
    bootstrap, data, port = own_broker
    topic = f"{topic_prefix}decisions"
    publish(bootstrap, topic, decision("other-job", "fail", ()))
    job = "outage-follow"
    argv = agent_cmd(bootstrap, topic_prefix, tmp_path / "spool", job, sys.executable, "-c",
                     "import time\nprint('running', flush=True)\ntime.sleep(300)\n",
                     extra=("--follow-decisions", "--heartbeat-s", "1", "--run-id", RUN))
    agent = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    err_lines: list[bytes] = []
    reader = threading.Thread(target=lambda: err_lines.extend(iter(agent.stderr.readline, b"")),
                              daemon=True)  # type: ignore[union-attr]
    reader.start()
    try:
        assert agent.stdout is not None and agent.stdout.readline() == b"running\n"
        time.sleep(2.0)  # the follower is positioned and fetching
        kafka_broker.down(data, port)
        time.sleep(3.0)  # past the first reconnect attempts
        n0, cpu0, t0 = len(err_lines), _cpu_s(agent.pid), time.monotonic()
        time.sleep(15.0)
        cpu_share = (_cpu_s(agent.pid) - cpu0) / (time.monotonic() - t0)
        logged = err_lines[n0:]
        kafka_broker.up(port=port, data_dir=data)
        publish(bootstrap, topic, decision(job, "fail", ()))
        with contextlib.suppress(subprocess.TimeoutExpired):
            agent.wait(timeout=60)
    finally:
        if agent.poll() is None:
            agent.kill()
            agent.wait()
    reader.join(timeout=10)
    err = b"".join(err_lines).decode(errors="replace")
    print(f"\nagent CPU while the broker was down: {cpu_share * 100:.1f}% of a core; "
          f"{len(logged)} log lines in 15 s")
    assert agent.returncode == EXIT_FAILED_BY_DECISION, err[-3000:]
    assert cpu_share < 0.05, (cpu_share, err[-3000:])
    assert len(logged) <= 5, b"".join(logged).decode()[-3000:]
