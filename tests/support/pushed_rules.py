"""A site rule no built-in rule knows, and what an agent would send when a job fails with it."""

from __future__ import annotations

import asyncio
import re
import time
import uuid
from typing import Any

from faultwatch import wire
from faultwatch.core.events import STDERR, Exit, Line, RunStart
from faultwatch.wire.topics import Topics
from tests.support.cluster import wait_decisions

FAILURE = "FluxError: the flux capacitor overheated at step 7"  # no built-in rule knows it


RETRYABLE = f"""\
version: 1
rules:
  - id: site.flux-overheat
    category: retryable
    contains: "flux capacitor overheated"
    description: our flux capacitors cool down after a restart
    tests:
      match: ["{FAILURE}"]
      no_match: ["flux capacitor nominal"]
"""


def feed_failure(bootstrap: str, prefix: str, job: str, text: str = FAILURE) -> None:
    """What an agent would send for a process that prints `text` and exits with 1."""
    from aiokafka import AIOKafkaProducer

    node, run_id, now = "n0", uuid.uuid4().hex, time.time()
    key = wire.log_key(job, node)
    recs = [
        wire.encode_run_start(RunStart(job=job, attempt=0, node=node, ts=now, run_id=run_id,
                                       nnodes=1, host="h0", pid=42, cmd=("train",))),
        wire.encode_lines(job, 0, node, run_id, [
            Line(STDERR, 0, now + 0.1, "step 1 loss 2.3"),
            Line(STDERR, 1, now + 0.2, text)]),
        wire.encode_exit(Exit(job=job, attempt=0, node=node, ts=now + 0.3, exit_code=1),
                         run_id),
    ]

    async def main() -> None:
        p = AIOKafkaProducer(bootstrap_servers=bootstrap, acks="all")
        await p.start()
        try:
            for r in recs:
                await p.send_and_wait(Topics(prefix).logs, value=r, key=key)
        finally:
            await p.stop()

    asyncio.run(main())


def rules_version_of(stdout: str) -> str:
    m = re.search(r"rules version ([0-9a-f]+)", stdout)
    assert m, stdout
    return m.group(1)


def one_decision(bootstrap: str, prefix: str, job: str) -> dict[str, Any]:
    decs = wait_decisions(bootstrap, prefix, job, timeout_s=60)
    assert len(decs) == 1, decs
    return decs[0]
