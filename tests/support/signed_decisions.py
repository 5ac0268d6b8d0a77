"""An agent that follows signed decisions, and raw decision records to publish to it."""

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

from faultwatch import wire
from faultwatch.core.events import Decision
from faultwatch.wire.signing import Key
from tests.support.agents import FOREVER
from tests.support.waiting import wait_until

KEY = Key("k2026", b"agent-test-secret-0123456789")


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
    """The first line from `q` containing `needle`; every line taken is added to `seen`."""
    def next_match() -> bytes | None:
        while True:
            try:
                line = q.get_nowait()
            except queue.Empty:
                return None
            seen.append(line)
            if needle in line:
                return line

    return wait_until(next_match, timeout_s, f"a line with {needle!r}", interval_s=0.2,
                      detail=lambda: "stderr:\n" + b"".join(seen[-40:]).decode(errors="replace"))


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
