"""Creating faultwatch's topics with the partition counts and cleanup policies they need."""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any

from faultwatch.kafka import clients
from faultwatch.kafka.errors import diagnose
from faultwatch.kafka.settings import KafkaSecurity
from faultwatch.wire.topics import (
    COMPACT,
    DEFAULT_PARTITIONS,
    INCIDENTS_RETENTION_S,
    TOPICS,
    Topics,
    TopicSpec,
)


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
    """Create the topics the processor creates (TOPICS rows `created="processor"`) if
    missing, each with its row's partitions (else `partitions`: logs, signals, decisions,
    control and incidents; signals must match the job table's partition count) and config;
    the rows with `retention` (incidents, acted) drop what is older than
    `incidents_retention_s`. Raises BrokerError."""
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
        new = [_new_topic(NewTopic, spec, topics.prefix, partitions, incidents_retention_s)
               for spec in TOPICS
               if spec.created == "processor" and spec.name(topics.prefix) not in existing]
        await _create_missing(admin, new)
    finally:
        await admin.close()


def _new_topic(new_topic: Any, spec: TopicSpec, prefix: str, partitions: int,
               retention_s: float) -> Any:
    """A NewTopic of one TOPICS row: its partition count (else `partitions`) and config."""
    config = dict(spec.config)
    if spec.retention:
        config["retention.ms"] = str(int(retention_s * 1000))
    kw: dict[str, Any] = {"topic_configs": config} if config else {}
    return new_topic(spec.name(prefix), num_partitions=spec.partitions or partitions,
                     replication_factor=1, **kw)


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
                                               topic_configs=dict(COMPACT))])
    finally:
        await admin.close()



async def ensure_all(bootstrap: str, topics: Topics, partitions: int = DEFAULT_PARTITIONS,
                     security: KafkaSecurity | None = None) -> None:
    """Every TOPICS row: the processor's (ensure_topics) and those their writers create
    (the nodes topic), as `kafka acls --apply` and `kafka up --secure` provision them."""
    await ensure_topics(bootstrap, topics, partitions, security=security)
    for spec in TOPICS:
        if spec.created == "writer":
            await ensure_compacted_topic(bootstrap, spec.name(topics.prefix), security=security)
