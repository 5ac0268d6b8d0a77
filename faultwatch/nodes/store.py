"""The node registry on Kafka: read the compacted `<prefix>nodes` topic, write node records."""

from __future__ import annotations

import asyncio
from typing import Any

from faultwatch.core.registry import NodeRecord, Registry
from faultwatch.kafka import clients
from faultwatch.nodes.writer import encode_signed
from faultwatch.wire import decode_node, node_key


def _decode_or_tombstone(value: bytes | None) -> dict[str, Any]:
    return {"rec": None if value is None else decode_node(value)}


def apply_record(registry: Registry, key: bytes | None, decoded: dict[str, Any]) -> None:
    """Fold one decoded nodes-topic record into a registry (a tombstone deletes the node)."""
    rec = decoded.get("rec")
    if rec is None:
        if key is not None:
            registry.pop(key.decode(errors="replace"), None)
        return
    registry[rec.node] = rec


async def load_registry(bootstrap: str, topic: str, must_exist: bool = False) -> Registry:
    """The registry as the topic holds it now (last record per node wins); undecodable
    records are logged with topic, partition and offset and skipped. A missing topic is an
    empty registry, or with `must_exist` a NotFoundError."""
    from faultwatch.kafka.reading import read_topic

    reg: Registry = {}
    async for msg, decoded in read_topic(bootstrap, topic, decoder=_decode_or_tombstone,
                                             must_exist=must_exist):
        apply_record(reg, msg.key, decoded)
    return reg


async def write_records(bootstrap: str, topic: str, records: list[NodeRecord],
                        timeout_s: float = 30.0, signer: Any = None) -> None:
    """Publish node records (acks=all, signed with `signer` if given) and wait until the
    broker has them."""
    if not records:
        return
    producer = clients.producer(bootstrap_servers=bootstrap, acks="all",
                                request_timeout_ms=int(timeout_s * 1000))
    await asyncio.wait_for(producer.start(), timeout_s)
    try:
        for rec in records:
            await asyncio.wait_for(producer.send_and_wait(topic, encode_signed(rec, signer),
                                                          key=node_key(rec.node)), timeout_s)
    finally:
        await producer.stop()
