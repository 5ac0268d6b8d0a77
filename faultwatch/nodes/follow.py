"""A processor's view of the node registry: follow the whole compacted `<prefix>nodes` topic
(no consumer group: every worker reads every node) into its RegistryWriter, for good."""

from __future__ import annotations

import asyncio
import uuid

from faultwatch import kafka_settings
from faultwatch.logs import log_event
from faultwatch.nodes.store import BROKER_ERRORS, ensure_nodes_topic
from faultwatch.nodes.writer import RegistryWriter

RETRY_FIRST_S, RETRY_MAX_S = 1.0, 30.0
POLL_MS = 500


async def follow_registry(bootstrap: str, topic: str, writer: RegistryWriter,
                          stop: asyncio.Event | None = None) -> None:
    """Create the topic if missing, read it from the beginning, then keep folding new records
    into `writer` until `stop` is set (or the task is cancelled). A broker error restarts
    the consumer from the beginning after a backoff (records are idempotent: last one per
    node wins); `writer.caught_up` is True once the topic was read to its end."""
    from aiokafka import AIOKafkaConsumer, TopicPartition

    stop = stop or asyncio.Event()
    backoff = RETRY_FIRST_S
    while not stop.is_set():
        consumer: AIOKafkaConsumer | None = None
        try:
            await ensure_nodes_topic(bootstrap, topic)
            consumer = AIOKafkaConsumer(
                bootstrap_servers=bootstrap, group_id=None, enable_auto_commit=False,
                client_id=f"faultwatch-registry-{uuid.uuid4().hex[:6]}",
                **kafka_settings.client_kwargs())
            await consumer.start()
            parts = consumer.partitions_for_topic(topic) or {0}
            tps = [TopicPartition(topic, p) for p in sorted(parts)]
            consumer.assign(tps)
            await consumer.seek_to_beginning(*tps)
            end = await consumer.end_offsets(tps)
            log_event("registry_following", topic=topic, partitions=len(tps))
            while not stop.is_set():
                batch = await consumer.getmany(timeout_ms=POLL_MS)
                for msgs in batch.values():
                    for m in msgs:
                        writer.observe(m.key, m.value,
                                       where=f"{m.topic}[{m.partition}]@{m.offset}")
                if not writer.caught_up and all(
                        [await consumer.position(tp) >= end[tp] for tp in tps]):
                    writer.caught_up = True
                    log_event("registry_loaded", topic=topic, nodes=len(writer.registry))
                backoff = RETRY_FIRST_S
        except asyncio.CancelledError:
            raise
        except BROKER_ERRORS as e:
            log_event("registry_follow_failed", topic=topic, retry_in_s=backoff,
                      error=f"{type(e).__name__}: {e}")
            try:
                await asyncio.wait_for(stop.wait(), backoff)
            except TimeoutError:
                pass
            backoff = min(RETRY_MAX_S, backoff * 2)
        finally:
            if consumer is not None:
                await consumer.stop()
