"""Creating faultwatch's topics with the partition counts and cleanup policies they need."""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any

from faultwatch.kafka import clients
from faultwatch.kafka.errors import diagnose
from faultwatch.kafka.settings import KafkaSecurity
from faultwatch.wire.topics import DEFAULT_PARTITIONS, INCIDENTS_RETENTION_S, Topics


async def _create_missing(admin: Any, new: list[Any]) -> None:
    from aiokafka.errors import TopicAlreadyExistsError  # type: ignore[import-untyped,unused-ignore]

    for t in new:
        try:
            await admin.create_topics([t])
        except TopicAlreadyExistsError:
            pass  # another process created it first


async def ensure_topics(bootstrap: str, topics: Topics, partitions: int = DEFAULT_PARTITIONS,
                        timeout_s: float = 30.0, security: KafkaSecurity | None = None,
                        incidents_retention_s: float = INCIDENTS_RETENTION_S) -> None:
    """Create the processor's topics if missing: logs, signals and decisions with
    `partitions` (signals must match the job table's partition count), the dead letters with
    one, the rules, status and holds topics compacted with one, the incidents topic compacted
    (each run's latest ledger) with `partitions`, both it and the acted topic deleting what is
    older than `incidents_retention_s`. Raises BrokerError."""
    from aiokafka.admin import NewTopic  # type: ignore[import-untyped,unused-ignore]

    admin = clients.admin(bootstrap_servers=bootstrap, request_timeout_ms=int(timeout_s * 1000),
                          security=security)
    try:
        await asyncio.wait_for(admin.start(), timeout_s)
    except Exception as e:
        with contextlib.suppress(Exception):
            await admin.close()
        raise await diagnose(e, bootstrap, "creating topics") from e
    try:
        existing = set(await admin.list_topics())
        new = [NewTopic(name, num_partitions=partitions, replication_factor=1)
               for name in (topics.logs, topics.signals, topics.decisions, topics.control)
               if name not in existing]
        if topics.deadletter not in existing:
            new.append(NewTopic(topics.deadletter, num_partitions=1, replication_factor=1))
        for compacted in (topics.rules, topics.status, topics.holds):
            if compacted not in existing:
                new.append(NewTopic(compacted, num_partitions=1, replication_factor=1,
                                    topic_configs={"cleanup.policy": "compact"}))
        keep = str(int(incidents_retention_s * 1000))
        if topics.incidents not in existing:
            new.append(NewTopic(topics.incidents, num_partitions=partitions,
                                replication_factor=1,
                                topic_configs={"cleanup.policy": "compact,delete",
                                               "retention.ms": keep}))
        if topics.acted not in existing:
            new.append(NewTopic(topics.acted, num_partitions=1, replication_factor=1,
                                topic_configs={"cleanup.policy": "delete",
                                               "retention.ms": keep}))
        await _create_missing(admin, new)
    finally:
        await admin.close()


async def ensure_compacted_topic(bootstrap: str, topic: str, timeout_s: float = 30.0,
                                 security: KafkaSecurity | None = None) -> None:
    """Create one compacted topic of one partition if missing (the nodes topic: node updates
    are rare; the rules topic, which `rules push` creates without the processor's others)."""
    from aiokafka.admin import NewTopic  # type: ignore[import-untyped,unused-ignore]

    admin = clients.admin(bootstrap_servers=bootstrap, request_timeout_ms=int(timeout_s * 1000),
                          security=security)
    await asyncio.wait_for(admin.start(), timeout_s)
    try:
        if topic in set(await admin.list_topics()):
            return
        await _create_missing(admin, [NewTopic(topic, num_partitions=1, replication_factor=1,
                                               topic_configs={"cleanup.policy": "compact"})])
    finally:
        await admin.close()

