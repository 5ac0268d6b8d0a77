"""A real agent with a decision key refuses unsigned and forged decisions, obeys signed ones."""

from __future__ import annotations

import asyncio
import os
import queue
import subprocess
import sys
import threading
import time
from pathlib import Path

import orjson
import pytest

from faultwatch import wire
from faultwatch.agents.config import EXIT_FAILED_BY_DECISION
from faultwatch.core.events import Decision
from faultwatch.wire import signing
from faultwatch.wire.signing import Key, Keyring

pytestmark = pytest.mark.kafka

KEY = Key("k2026", b"agent-test-secret-0123456789")
FOREVER = "import time\nprint('running', flush=True)\nwhile True: time.sleep(0.05)\n"


def fail_dict(job: str, did: str) -> dict[str, object]:
    return wire.decision_to_dict(Decision(id=did, job=job, attempt=0, action="fail",
                                          run_id="R1",
                                          kind="error", ts=time.time(), nodes=()))


def publish(bootstrap: str, topic: str, job: str, *values: dict[str, object]) -> None:
    from aiokafka import AIOKafkaProducer

    async def main() -> None:
        p = AIOKafkaProducer(bootstrap_servers=bootstrap, acks="all")
        await p.start()
        try:
            for v in values:
                await p.send_and_wait(topic, orjson.dumps(v), key=wire.job_key(job))
        finally:
            await p.stop()

    asyncio.run(main())


def lines_of(stream: object) -> queue.Queue[bytes]:
    q: queue.Queue[bytes] = queue.Queue()

    def pump() -> None:
        for line in iter(stream.readline, b""):  # type: ignore[attr-defined]
            q.put(line)

    threading.Thread(target=pump, daemon=True).start()
    return q


def wait_line(q: queue.Queue[bytes], needle: bytes, timeout_s: float, seen: list[bytes]) -> bytes:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            line = q.get(timeout=0.2)
        except queue.Empty:
            continue
        seen.append(line)
        if needle in line:
            return line
    raise AssertionError(f"no {needle!r} within {timeout_s} s; stderr:\n"
                         + b"".join(seen[-40:]).decode(errors="replace"))


def start_agent(bootstrap: str, prefix: str, tmp: Path, job: str,
                env_extra: dict[str, str]) -> subprocess.Popen[bytes]:
    # the decisions topic exists before the agent starts (the processor creates it)
    publish(bootstrap, f"{prefix}decisions", "other-job", fail_dict("other-job", "x"))
    argv = [sys.executable, "-m", "faultwatch", "agent", "--bootstrap", bootstrap,
            "--job", job, "--node", "n1", "--topic-prefix", prefix, "--spool-dir", str(tmp),
            "--heartbeat-s", "0.5", "--follow-decisions", "--run-id", "R1", "--",
            sys.executable, "-c", FOREVER]
    env = {k: v for k, v in os.environ.items() if not k.startswith("FAULTWATCH_DECISION_KEY")}
    return subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            env={**env, **env_extra})


def test_forged_and_unsigned_fail_decisions_do_not_stop_an_agent_with_a_key(
        kafka_bootstrap: str, topic_prefix: str, tmp_path: Path) -> None:
    job = "signed-fail"
    topic = f"{topic_prefix}decisions"
    p = start_agent(kafka_bootstrap, topic_prefix, tmp_path, job,
                    {signing.KEY_ENV: f"{KEY.key_id}:{KEY.secret.decode()}"})
    try:
        assert p.stdout is not None and p.stderr is not None
        assert p.stdout.readline() == b"running\n"
        err = lines_of(p.stderr)
        seen: list[bytes] = []
        forged = signing.sign(fail_dict(job, "forged"),
                              Keyring((Key(KEY.key_id, b"attacker-guess-0123456789"),)))
        publish(kafka_bootstrap, topic, job, fail_dict(job, "unsigned"), forged)
        first = wait_line(err, b"event=decision_refused", 60, seen)
        second = wait_line(err, b"event=decision_refused", 30, seen)
        assert b"reason=unsigned" in first and b"id=unsigned" in first
        assert b"reason=bad_signature" in second and b"id=forged" in second
        assert p.poll() is None  # still running after two fail decisions
        # positive control: the same decision signed with the agent's key stops it
        publish(kafka_bootstrap, topic, job, signing.sign(fail_dict(job, "real"),
                                                          Keyring((KEY,))))
        assert p.wait(timeout=60) == EXIT_FAILED_BY_DECISION
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()


def test_without_a_key_the_agent_warns_once_and_obeys(
        kafka_bootstrap: str, topic_prefix: str, tmp_path: Path) -> None:
    job = "unsigned-fail"
    p = start_agent(kafka_bootstrap, topic_prefix, tmp_path, job, {})
    try:
        assert p.stdout is not None and p.stdout.readline() == b"running\n"
        publish(kafka_bootstrap, f"{topic_prefix}decisions", job, fail_dict(job, "plain"))
        _, err = p.communicate(timeout=60)
        assert p.returncode == EXIT_FAILED_BY_DECISION, err.decode()[-3000:]
        assert err.count(b"event=decisions_unverified") == 1, err.decode()[-3000:]
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()
