"""Reading and writing test topics directly on the real broker: aiokafka and the wire format,
none of faultwatch's own clients."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import orjson
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer

from faultwatch import wire
from tests.support.waiting import wait_until_async


def consume(bootstrap: str, topic: str, until: Callable[[list[dict[str, Any]]], bool],
            timeout: float = 30.0) -> list[dict[str, Any]]:
    """The decoded records of `topic` from the start, read until `until(records)` holds or
    `timeout` passes (then what was read; the caller asserts on it)."""
    async def main() -> list[dict[str, Any]]:
        c = AIOKafkaConsumer(topic, bootstrap_servers=bootstrap, auto_offset_reset="earliest",
                             enable_auto_commit=False, group_id=None)
        await c.start()
        out: list[dict[str, Any]] = []

        async def more() -> list[dict[str, Any]]:
            for msgs in (await c.getmany(timeout_ms=500)).values():
                out.extend(wire.decode(m.value) for m in msgs)
            return out

        try:
            if not until(out):
                await wait_until_async(more, timeout, f"records on {topic}", interval_s=0,
                                       until=until, raise_on_timeout=False)
        finally:
            await c.stop()
        return out

    return asyncio.run(main())


def produce(bootstrap: str, topic: str, key: bytes, values: list[bytes]) -> None:
    async def main() -> None:
        p = AIOKafkaProducer(bootstrap_servers=bootstrap)
        await p.start()
        try:
            for v in values:
                await p.send_and_wait(topic, v, key=key)
        finally:
            await p.stop()

    asyncio.run(main())


async def produce_records(bootstrap: str, topic: str, records: list[tuple[bytes, bytes]]) -> None:
    p = AIOKafkaProducer(bootstrap_servers=bootstrap)
    await p.start()
    try:
        for key, value in records:
            await p.send_and_wait(topic, value, key=key)
    finally:
        await p.stop()


async def read_all(bootstrap: str, topic: str, want: int, timeout_s: float) -> list[dict]:
    """The JSON records of `topic` from the start: `want` of them, or what came in `timeout_s`."""
    c = AIOKafkaConsumer(topic, bootstrap_servers=bootstrap, auto_offset_reset="earliest",
                         group_id=None)
    await c.start()
    out: list[dict] = []

    async def more() -> list[dict]:
        batch = await c.getmany(timeout_ms=500)
        out.extend(orjson.loads(m.value) for msgs in batch.values() for m in msgs)
        return out

    try:
        if want > 0:
            await wait_until_async(more, timeout_s, f"{want} records on {topic}", interval_s=0,
                                   until=lambda got: len(got) >= want, raise_on_timeout=False)
    finally:
        await c.stop()
    return out


def read_topic(bootstrap: str, topic: str, timeout: float = 5.0) -> list[Any]:
    """Every record on the topic now ([] when the topic does not exist)."""
    from faultwatch.rollout.rules_watch import assign_topic

    async def main() -> list[Any]:
        c = AIOKafkaConsumer(bootstrap_servers=bootstrap, group_id=None,
                             enable_auto_commit=False, auto_offset_reset="earliest")
        await c.start()
        try:
            tps = await assign_topic(c, topic)
            if not tps:
                return []
            end = await c.end_offsets(tps)
            out: list[Any] = []

            async def at_end() -> bool:
                if all([await c.position(tp) >= end[tp] for tp in tps]):
                    return True
                for msgs in (await c.getmany(timeout_ms=300)).values():
                    out.extend(msgs)
                return False

            await wait_until_async(at_end, timeout, f"the end of {topic}", interval_s=0,
                                   raise_on_timeout=False)
            return out
        finally:
            await c.stop()

    return asyncio.run(main())
