"""Following the holds topic: read it whole from the beginning (no consumer group: every
follower knows every hold), then each new record, into a HoldsTable. A missing topic is
waited for (the processors create it with their others; `faultwatch notify` may not create
topics); a broker error restarts from the beginning after a backoff (the last record per
kind and job wins)."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from typing import Any

from faultwatch.eventlog import log_event
from faultwatch.holds.table import HoldsTable
from faultwatch.kafka.following import TopicFollower

TOPIC_POLL_S = 5.0


def holds_table(log: Any = log_event) -> HoldsTable:
    """A table whose records must carry an operator's signature when $FAULTWATCH_TRUST_FILE
    is set (trust purpose `hold`)."""
    from faultwatch.trust.keys import load_trust
    from faultwatch.trust.records import HOLD, RecordGate, verifier_for

    return HoldsTable(RecordGate("hold", verifier_for(HOLD, load_trust()), log), log)


class HoldsFollower(TopicFollower):
    """The whole holds topic, from the beginning, into a HoldsTable; a missing topic is asked
    for again every TOPIC_POLL_S (the table counts as caught up meanwhile: no job is held)."""

    client = "holds"
    failed_event = "holds_follow_failed"

    def __init__(self, bootstrap: str, topic: str, table: HoldsTable) -> None:
        super().__init__(bootstrap, topic, table)
        self.table = table

    async def partitions(self, consumer: Any, stop: asyncio.Event) -> set[int]:
        parts: set[int] = set()
        while not parts and not stop.is_set():
            parts = await super().partitions(consumer, stop)
            if not parts:
                self.table.caught_up = True  # nothing to read: no job is held
                await asyncio.sleep(TOPIC_POLL_S)
        return parts

    async def take(self, batch: Mapping[Any, list[Any]]) -> None:
        for msgs in batch.values():
            for m in msgs:
                where = f"{m.topic}[{m.partition}]@{m.offset}"
                h = self.table.observe(m.key, m.value, where)
                if h is not None and self.table.caught_up:  # live changes: a line each
                    log_event("job_hold", job=h.job, kind=h.kind, by=h.by,
                              until=h.until, released=h.released, at=where)

    def loaded(self) -> None:
        log_event("holds_loaded", topic=self.topic, holds=len(self.table.holds))


async def follow_holds(bootstrap: str, topic: str, table: HoldsTable,
                       stop: asyncio.Event | None = None) -> None:
    """Fold the topic into `table` until `stop` is set (or the task is cancelled);
    `table.caught_up` is True once it was read to its end."""
    await HoldsFollower(bootstrap, topic, table).run(stop)
