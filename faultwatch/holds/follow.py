"""Following the holds topic: read it whole from the beginning (no consumer group: every
follower knows every hold), then each new record, into a HoldsTable. A missing topic is
waited for (the processors create it with their others; `faultwatch notify` may not create
topics); a broker error restarts from the beginning after a backoff (the last record per
kind and job wins)."""

from __future__ import annotations

import asyncio
import uuid
from typing import Any

from faultwatch.eventlog import log_event
from faultwatch.holds.table import HoldsTable
from faultwatch.kafka import clients
from faultwatch.kafka.calm import RETRY_BACKOFF_MS
from faultwatch.kafka.errors import BROKER_ERRORS

RETRY_FIRST_S, RETRY_MAX_S = 1.0, 30.0
TOPIC_POLL_S = 5.0
POLL_MS = 500


def holds_table(log: Any = log_event) -> HoldsTable:
    """A table whose records must carry an operator's signature when $FAULTWATCH_TRUST_FILE
    is set (trust purpose `hold`)."""
    from faultwatch.trust.keys import load_trust
    from faultwatch.trust.records import HOLD, RecordGate, verifier_for

    return HoldsTable(RecordGate("hold", verifier_for(HOLD, load_trust()), log), log)


async def follow_holds(bootstrap: str, topic: str, table: HoldsTable,
                       stop: asyncio.Event | None = None) -> None:
    """Fold the topic into `table` until `stop` is set (or the task is cancelled);
    `table.caught_up` is True once it was read to its end."""
    from aiokafka import TopicPartition

    stop = stop or asyncio.Event()
    backoff = RETRY_FIRST_S
    while not stop.is_set():
        consumer: Any = None
        try:
            consumer = clients.consumer(
                bootstrap_servers=bootstrap, group_id=None, enable_auto_commit=False,
                client_id=f"faultwatch-holds-{uuid.uuid4().hex[:6]}",
                retry_backoff_ms=RETRY_BACKOFF_MS)
            await consumer.start()
            parts: set[int] = set()
            while not parts and not stop.is_set():
                await consumer._client.force_metadata_update()  # noqa: SLF001 - new topics
                parts = consumer.partitions_for_topic(topic) or set()
                if not parts:
                    table.caught_up = True  # nothing to read: no job is held
                    await asyncio.sleep(TOPIC_POLL_S)
            tps = [TopicPartition(topic, p) for p in sorted(parts)]
            consumer.assign(tps)
            await consumer.seek_to_beginning(*tps)
            end = await consumer.end_offsets(tps)
            while not stop.is_set():
                batch = await consumer.getmany(timeout_ms=POLL_MS)
                for msgs in batch.values():
                    for m in msgs:
                        where = f"{m.topic}[{m.partition}]@{m.offset}"
                        h = table.observe(m.key, m.value, where)
                        if h is not None and table.caught_up:  # live changes: a line each
                            log_event("job_hold", job=h.job, kind=h.kind, by=h.by,
                                      until=h.until, released=h.released, at=where)
                if not table.caught_up and all(
                        [await consumer.position(tp) >= end[tp] for tp in tps]):
                    table.caught_up = True
                    log_event("holds_loaded", topic=topic, holds=len(table.holds))
                backoff = RETRY_FIRST_S
        except asyncio.CancelledError:
            raise
        except BROKER_ERRORS as e:
            log_event("holds_follow_failed", topic=topic, retry_in_s=backoff,
                      error=f"{type(e).__name__}: {e}")
            try:
                await asyncio.wait_for(stop.wait(), backoff)
            except TimeoutError:
                pass
            backoff = min(RETRY_MAX_S, backoff * 2)
        finally:
            if consumer is not None:
                await consumer.stop()
