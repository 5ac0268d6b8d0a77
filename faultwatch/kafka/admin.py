"""Creating faultwatch's topics with the partition counts and cleanup policies they need."""

from __future__ import annotations

import asyncio
import contextlib

from aiokafka.admin import AIOKafkaAdminClient, NewTopic
from aiokafka.errors import TopicAlreadyExistsError

from faultwatch import kafka_settings
from faultwatch.wire.topics import DEFAULT_PARTITIONS, Topics


async def ensure_topics(bootstrap: str, topics: Topics, partitions: int = DEFAULT_PARTITIONS,
                        timeout_s: float = 30.0) -> None:
    """Create the topics if missing (signals must match the job table's partition count)."""
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap,
                                request_timeout_ms=int(timeout_s * 1000),
                                **kafka_settings.client_kwargs())
    try:
        await asyncio.wait_for(admin.start(), timeout_s)
    except Exception as e:
        with contextlib.suppress(Exception):
            await admin.close()
        raise await kafka_settings.diagnose(e, bootstrap, "creating topics") from e
    try:
        existing = set(await admin.list_topics())
        new = [NewTopic(name, num_partitions=partitions, replication_factor=1)
               for name in (topics.logs, topics.signals, topics.decisions) if name not in existing]
        if topics.deadletter not in existing:
            new.append(NewTopic(topics.deadletter, num_partitions=1, replication_factor=1))
        for compacted in (topics.rules, topics.status):
            if compacted not in existing:
                new.append(NewTopic(compacted, num_partitions=1, replication_factor=1,
                                    topic_configs={"cleanup.policy": "compact"}))
        for t in new:
            try:
                await admin.create_topics([t])
            except TopicAlreadyExistsError:
                pass
    finally:
        await admin.close()


async def ensure_nodes_topic(bootstrap: str, topic: str, timeout_s: float = 30.0) -> None:
    """Create the compacted nodes topic (one partition: node updates are rare) if missing."""
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap,
                                request_timeout_ms=int(timeout_s * 1000),
                                **kafka_settings.client_kwargs())
    await asyncio.wait_for(admin.start(), timeout_s)
    try:
        if topic in set(await admin.list_topics()):
            return
        try:
            await admin.create_topics([NewTopic(topic, num_partitions=1, replication_factor=1,
                                                topic_configs={"cleanup.policy": "compact"})])
        except TopicAlreadyExistsError:
            pass
    finally:
        await admin.close()
