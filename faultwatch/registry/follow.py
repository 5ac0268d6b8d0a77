"""A processor's link to the node registry: follow the whole compacted `<prefix>nodes` topic
(no consumer group: every worker reads every node) into its RegistryWriter, and publish the
records its decisions change (its own producer: the topic is no part of the Faust app)."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Mapping
from typing import Any

from faultwatch.core.events import Decision
from faultwatch.core.registry import RegistryPolicy
from faultwatch.eventlog import log_event
from faultwatch.kafka import clients
from faultwatch.kafka.admin import ensure_compacted_topic
from faultwatch.kafka.errors import BROKER_ERRORS
from faultwatch.kafka.following import RETRY_BACKOFF_MS, RETRY_FIRST_S, RETRY_MAX_S, TopicFollower
from faultwatch.registry.writer import RegistryWriter


class RegistryFollower(TopicFollower):
    """The whole nodes topic, from the beginning, into a RegistryWriter; the topic is created
    if missing (a single partition when its metadata is not known yet)."""

    client = "registry"
    following_event = "registry_following"
    failed_event = "registry_follow_failed"

    def __init__(self, bootstrap: str, topic: str, writer: RegistryWriter) -> None:
        super().__init__(bootstrap, topic, writer)
        self.writer = writer

    async def prepare(self) -> None:
        await ensure_compacted_topic(self.bootstrap, self.topic)

    async def partitions(self, consumer: Any, stop: asyncio.Event) -> set[int]:
        return await super().partitions(consumer, stop) or {0}

    async def take(self, batch: Mapping[Any, list[Any]]) -> None:
        writer = self.writer
        for msgs in batch.values():
            for m in msgs:
                where = f"{m.topic}[{m.partition}]@{m.offset}"
                writer.observe(m.key, m.value, where=where)
                if writer.caught_up:  # live changes (rare) are worth a line each
                    rec = writer.registry.get((m.key or b"").decode(errors="replace"))
                    log_event("registry_node", node=rec.node if rec else m.key,
                              state=rec.state if rec else "deleted", at=where)

    def loaded(self) -> None:
        log_event("registry_loaded", topic=self.topic, nodes=len(self.writer.registry))


async def follow_registry(bootstrap: str, topic: str, writer: RegistryWriter,
                          stop: asyncio.Event | None = None) -> None:
    """Create the topic if missing, read it from the beginning, then keep folding new records
    into `writer` until `stop` is set (or the task is cancelled). A broker error restarts
    the consumer from the beginning after a backoff (records are idempotent: last one per
    node wins); `writer.caught_up` is True once the topic was read to its end."""
    await RegistryFollower(bootstrap, topic, writer).run(stop)


class RegistryLink:
    """One per processor worker: `writer` (what the gate asks), `follow()` (a task), and
    `publish(decisions)` after the decisions themselves are delivered."""

    def __init__(self, bootstrap: str, topic: str, policy: RegistryPolicy | None = None,
                 gate: Any = None, signer: Any = None) -> None:
        self.bootstrap, self.topic = bootstrap, topic
        self.writer = RegistryWriter(policy, gate, signer)
        self._producer: Any = None

    async def follow(self) -> None:
        """Run for the worker's life (its producer is closed when this task ends)."""
        try:
            await follow_registry(self.bootstrap, self.topic, self.writer)
        finally:
            await self.close()

    async def publish(self, decisions: list[Decision], now: float) -> int:
        """Write the registry records `decisions` change; retried with backoff until the
        broker has them (at least once: records are idempotent). Returns how many."""
        records = self.writer.updates(decisions, now)
        backoff = RETRY_FIRST_S
        while records:
            try:
                if self._producer is None:
                    self._producer = clients.producer(bootstrap_servers=self.bootstrap,
                                                      acks="all",
                                                      retry_backoff_ms=RETRY_BACKOFF_MS)
                    await self._producer.start()
                for key, value in records:
                    await self._producer.send_and_wait(self.topic, value, key=key)
                return len(records)
            except BROKER_ERRORS as e:
                log_event("produce_failed", what="nodes", pending=len(records),
                          retry_in_s=backoff, error=f"{type(e).__name__}: {e}")
                producer, self._producer = self._producer, None
                if producer is not None:
                    with contextlib.suppress(Exception):
                        await producer.stop()
                await asyncio.sleep(backoff)
                backoff = min(RETRY_MAX_S, backoff * 2)
        return 0

    async def close(self) -> None:
        if self._producer is not None:
            await self._producer.stop()
            self._producer = None
