"""Publishing a rule set on the rules topic (`faultwatch rules push` calls `push`); aiokafka is
imported lazily."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from pathlib import Path

from faultwatch import kafka_settings
from faultwatch.errors import BrokerError, FaultwatchError
from faultwatch.rules import RuleSet
from faultwatch.streams.rules_record import RULESET_KEY, build_record
from faultwatch.wire import MAX_RULESET_RECORD_BYTES
from faultwatch.wire.topics import Topics


async def _ensure_rules_topic(bootstrap: str, topics: Topics, timeout_s: float) -> None:
    """Create only the compacted rules topic (the other topics' partition counts belong to
    `faultwatch process --partitions`, so push must not create them)."""
    from aiokafka.admin import AIOKafkaAdminClient, NewTopic
    from aiokafka.errors import TopicAlreadyExistsError

    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap,
                                request_timeout_ms=int(timeout_s * 1000),
                                **kafka_settings.client_kwargs())
    await asyncio.wait_for(admin.start(), timeout_s)
    try:
        if topics.rules in set(await admin.list_topics()):
            return
        try:
            await admin.create_topics([NewTopic(topics.rules, num_partitions=1,
                                                replication_factor=1,
                                                topic_configs={"cleanup.policy": "compact"})])
        except TopicAlreadyExistsError:
            pass
    finally:
        await admin.close()


async def publish_record(bootstrap: str, topic: str, value: bytes | None,
                         key: bytes = RULESET_KEY, timeout_s: float = 30.0) -> None:
    """Write one record to the rules topic (acks=all). Also used by tests to bypass push."""
    from aiokafka import AIOKafkaProducer

    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, acks="all",
                                compression_type="gzip", max_request_size=MAX_RULESET_RECORD_BYTES,
                                request_timeout_ms=int(timeout_s * 1000),
                                **kafka_settings.client_kwargs())
    await asyncio.wait_for(producer.start(), timeout_s)
    try:
        await asyncio.wait_for(producer.send_and_wait(topic, value=value, key=key), timeout_s)
    finally:
        await producer.stop()


async def push(bootstrap: str, paths: Sequence[str | Path], *, topics: Topics | None = None,
               builtin: bool = True, timeout_s: float = 30.0) -> RuleSet:
    """Validate the files (RuleError, nothing published) and publish them as the rule set."""
    topics = topics or Topics()
    record, ruleset = build_record(paths, builtin=builtin)
    try:
        await _ensure_rules_topic(bootstrap, topics, timeout_s)
        await publish_record(bootstrap, topics.rules, record, timeout_s=timeout_s)
    except FaultwatchError:
        raise
    except Exception as e:  # noqa: BLE001 - any Kafka failure: one clear message
        raise BrokerError(f"could not publish the rule set to {topics.rules} at {bootstrap}: "
                          f"{type(e).__name__}: {e}") from None
    return ruleset
