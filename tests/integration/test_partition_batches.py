"""The matcher's signals go out as one produce batch per partition (faust_compat.
PartitionBatches): each record lands on the partition a keyed send puts it on, in order per
key, on a real broker, a record bigger than a batch in a batch of its own."""

from __future__ import annotations

import asyncio
import types
import uuid
from typing import Any

import pytest

from faultwatch.streams.faust_compat import PartitionBatches

pytestmark = [pytest.mark.kafka]


async def _placed(bootstrap: str, topic: str, want: int) -> dict[bytes, list[tuple[int, bytes]]]:
    """key -> [(partition, value)] in offset order, once `want` records are on the topic."""
    from aiokafka import AIOKafkaConsumer

    c = AIOKafkaConsumer(topic, bootstrap_servers=bootstrap, auto_offset_reset="earliest",
                         enable_auto_commit=False, group_id=None)
    await c.start()
    try:
        out: dict[bytes, list[tuple[int, bytes]]] = {}
        got = 0
        async with asyncio.timeout(60):
            while got < want:
                for tp, msgs in (await c.getmany(timeout_ms=500)).items():
                    for m in msgs:
                        out.setdefault(m.key, []).append((tp.partition, m.value))
                        got += 1
        return out
    finally:
        await c.stop()


def test_each_record_goes_where_a_keyed_send_puts_it_in_order(kafka_bootstrap: str) -> None:
    from aiokafka import AIOKafkaProducer
    from aiokafka.admin import AIOKafkaAdminClient, NewTopic

    base = f"pb-{uuid.uuid4().hex[:8]}"
    batched, keyed = f"{base}.batched", f"{base}.keyed"
    keys = [f"job-{i:03d}".encode() for i in range(60)]
    records = [(k, f"{k.decode()}#{n}".encode()) for n in range(5) for k in keys]
    total = len(records) + 2

    async def main() -> tuple[Any, Any]:
        admin = AIOKafkaAdminClient(bootstrap_servers=kafka_bootstrap)
        await admin.start()
        try:
            await admin.create_topics([NewTopic(t, 4, 1) for t in (batched, keyed)])
        finally:
            await admin.close()
        producer = AIOKafkaProducer(bootstrap_servers=kafka_bootstrap, max_batch_size=4096)
        await producer.start()
        try:
            app: Any = types.SimpleNamespace(producer=types.SimpleNamespace(
                _ensure_producer=lambda: producer))
            out = PartitionBatches(app, batched)
            sends = await out.sends(records)
            assert 1 < len(sends) <= 4  # one per partition used
            await asyncio.gather(*[await s() for s in sends])  # several batches each (4 kB)
            await asyncio.gather(*[await producer.send(keyed, v, key=k) for k, v in records])
            big = [(b"job-007", b"x" * 10_000), (b"job-007", b"job-007#5")]
            await asyncio.gather(*[await s() for s in await out.sends(big)])  # own batch
            await asyncio.gather(*[await producer.send(keyed, v, key=k) for k, v in big])
        finally:
            await producer.stop()
        return (await _placed(kafka_bootstrap, batched, total),
                await _placed(kafka_bootstrap, keyed, total))

    got, want = asyncio.run(main())
    assert got == want  # same partition for every key, same order within it
    assert len({p for placed in got.values() for p, _ in placed}) > 1
    assert [v for _, v in got[b"job-007"]] == [
        *(f"job-007#{n}".encode() for n in range(5)), b"x" * 10_000, b"job-007#5"]
