"""The command side of holds (`faultwatch jobs`): read the holds topic as it is now, and write
one operator-signed hold, mute or release; Kafka's errors become a BrokerError."""

from __future__ import annotations

import asyncio
from typing import Any

from faultwatch.core.holds import Hold
from faultwatch.holds.table import HoldsTable
from faultwatch.wire.holds import encode_hold, hold_dict, hold_key


async def load_holds(bootstrap: str, topic: str) -> HoldsTable:
    """Every record on the topic now, folded (a missing topic: no holds). Unverified: the
    operator reads what is there; the followers check the signatures."""
    from faultwatch.kafka.reading import read_topic

    table = HoldsTable()
    async for msg, value in read_topic(bootstrap, topic, decoder=lambda v: v):
        table.observe(msg.key, value)
    table.caught_up = True
    return table


def read_holds(bootstrap: str, topic: str) -> HoldsTable:
    from faultwatch.kafka.errors import BROKER_ERRORS, broker_error

    try:
        return asyncio.run(load_holds(bootstrap, topic))
    except BROKER_ERRORS as e:
        raise broker_error(e, bootstrap, f"reading {topic}") from None


def write_hold(bootstrap: str, topic: str, hold: Hold, signer: Any = None,
               timeout_s: float = 30.0) -> bytes:
    """Write `hold` (signed by `signer`, a trust.records.RecordSigner, if given), creating
    the compacted topic if needed; the record written."""
    from faultwatch.kafka import clients
    from faultwatch.kafka.admin import ensure_compacted_topic
    from faultwatch.kafka.errors import BROKER_ERRORS, broker_error

    record = hold_dict(hold)
    value = encode_hold(signer.sign_record(record) if signer is not None else record)

    async def main() -> None:
        await ensure_compacted_topic(bootstrap, topic, timeout_s)
        producer = clients.producer(bootstrap_servers=bootstrap, acks="all",
                                    request_timeout_ms=int(timeout_s * 1000))
        await asyncio.wait_for(producer.start(), timeout_s)
        try:
            await asyncio.wait_for(producer.send_and_wait(topic, value,
                                                          key=hold_key(hold.kind, hold.job)),
                                   timeout_s)
        finally:
            await producer.stop()

    try:
        asyncio.run(main())
    except BROKER_ERRORS as e:
        raise broker_error(e, bootstrap, f"writing the {hold.kind} of {hold.job} to {topic}"
                           ) from None
    return value
