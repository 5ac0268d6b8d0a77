"""Topic names (prefix configurable) and their creation with the partition counts we need."""

from __future__ import annotations

import asyncio
import contextlib
from dataclasses import dataclass

from aiokafka.admin import AIOKafkaAdminClient, NewTopic
from aiokafka.errors import TopicAlreadyExistsError

from faultwatch import kafka_settings

DEFAULT_PREFIX = "faultwatch."
DEFAULT_PARTITIONS = 4


@dataclass(frozen=True)
class Topics:
    """The names of faultwatch's topics under one prefix."""

    prefix: str = DEFAULT_PREFIX

    @property
    def logs(self) -> str:
        return f"{self.prefix}logs"

    @property
    def signals(self) -> str:
        return f"{self.prefix}signals"

    @property
    def decisions(self) -> str:
        return f"{self.prefix}decisions"

    @property
    def control(self) -> str:
        """Control traffic for the agents (diagnosis requests), keyed by job; schedulers,
        readers and notifiers never read it (docs/decisions.md, "Control topic")."""
        return f"{self.prefix}control"

    @property
    def deadletter(self) -> str:
        return f"{self.prefix}deadletter"

    @property
    def rules(self) -> str:
        return f"{self.prefix}rules"

    @property
    def status(self) -> str:
        return f"{self.prefix}status"


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
               for name in (topics.logs, topics.signals, topics.decisions, topics.control)
               if name not in existing]
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
