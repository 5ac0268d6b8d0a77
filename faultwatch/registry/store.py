"""The node registry on Kafka: read the compacted `<prefix>nodes` topic, write node records."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import Any

from faultwatch.core.registry import NodeRecord, Registry
from faultwatch.kafka import clients
from faultwatch.registry.writer import encode_signed
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


@dataclass
class Refused:
    """Records of one key the trust file refused: reasons counted, where the last one was."""

    count: int = 0
    reasons: dict[str, int] = field(default_factory=dict)
    last_at: str = ""


async def load_verified(bootstrap: str, topic: str, verifier: Any, must_exist: bool = False
                        ) -> tuple[Registry, dict[str, Refused]]:
    """The registry as its consumers (processors, actuate) take it with `verifier` (a
    trust.records.RecordVerifier): signed records in version order; unsigned, forged and
    replayed ones are left out and returned per key instead of being shown as the state."""
    from faultwatch.kafka.reading import read_topic
    from faultwatch.registry.writer import RegistryWriter
    from faultwatch.trust.records import RecordGate

    refused: dict[str, Refused] = {}
    key = ""

    def note(event: str, **fields: Any) -> None:
        if not event.endswith("_refused"):
            return
        r = refused.setdefault(key, Refused())
        r.count += 1
        reason = str(fields.get("reason", "?"))
        r.reasons[reason] = r.reasons.get(reason, 0) + 1
        r.last_at = str(fields.get("where", ""))

    writer = RegistryWriter(gate=RecordGate("node_record", verifier, note))
    async for msg, value in read_topic(bootstrap, topic, decoder=lambda v: v,
                                       must_exist=must_exist):
        key = (msg.key or b"").decode(errors="replace")
        writer.observe(msg.key, value, where=f"{msg.topic}[{msg.partition}]@{msg.offset}")
    return writer.registry, refused


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
