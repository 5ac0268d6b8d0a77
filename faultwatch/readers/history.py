"""What the processor learned from a job's earlier runs, read back from Kafka for `faultwatch
check --bootstrap`: the job's decisions (its key only) and its status snapshot, summarised by
core/learned.py. Bounded: the decisions topic is read to its end once, keeping the job's key;
a job with more than MAX_DECISIONS decisions keeps the newest."""

from __future__ import annotations

import asyncio
from collections import deque
from typing import Any

from faultwatch.core.learned import Learned, learned_from

MAX_DECISIONS = 10_000
READ_TIMEOUT_S = 60.0


async def _read(bootstrap: str, decisions_topic: str, status_topic: str, job: str
                ) -> tuple[list[dict[str, Any]], dict[str, Any] | None]:
    from faultwatch.kafka.reading import read_topic
    from faultwatch.readers.status import read_snapshots
    from faultwatch.wire import decision_to_dict, decode_decision, job_key

    decs: deque[dict[str, Any]] = deque(maxlen=MAX_DECISIONS)
    async for _msg, dec in read_topic(bootstrap, decisions_topic, key=job_key(job),
                                      decoder=decode_decision):
        if dec.job == job:
            decs.append(decision_to_dict(dec))
    snaps = await read_snapshots(bootstrap, status_topic, job, must_exist=False)
    return list(decs), snaps.get(job)


def read_learned(bootstrap: str, decisions_topic: str, status_topic: str, job: str) -> Learned:
    """The Learned summary of `job`, or an unavailable one saying why (a BrokerError of an
    unreachable Kafka propagates: the caller asked for it)."""
    decs, status = asyncio.run(asyncio.wait_for(
        _read(bootstrap, decisions_topic, status_topic, job), READ_TIMEOUT_S))
    if not decs and status is None:
        return Learned(available=False, why=f"no decision or status of job {job!r} at "
                                            f"{bootstrap} (no earlier run, or another "
                                            "--topic-prefix)")
    return learned_from(decs, status)
