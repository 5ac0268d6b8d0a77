"""Changes made by hand (`faultwatch nodes quarantine|release`): read the node's record, apply
the change, write the new record; Kafka's errors become a BrokerError."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Any

from faultwatch.core.registry import NodeRecord

Change = Callable[[NodeRecord | None, str, float], NodeRecord]  # (record, node, now) -> new


def change_node(bootstrap: str, topic: str, node: str, make: Change,
                signer: Any = None, must_exist: str | None = None) -> NodeRecord:
    """Apply `make` to `node`'s current record (creating the topic if needed); the new
    record, written (signed by `signer`, trust.records.signer_for, if given). With a trust
    file the current record is the newest one that verifies (a forged record is no base),
    and the new one's version follows it. With `must_exist` (what the change is, for the
    message) a node the registry does not hold is a NotFoundError naming the close ones, and
    nothing is written."""
    from faultwatch.kafka.admin import ensure_compacted_topic
    from faultwatch.kafka.errors import BROKER_ERRORS, broker_error
    from faultwatch.registry.store import load_registry, load_verified, write_records
    from faultwatch.trust.keys import load_trust
    from faultwatch.trust.records import NODE_RECORD, verifier_for

    verifier = verifier_for(NODE_RECORD, load_trust())

    async def main() -> NodeRecord:
        await ensure_compacted_topic(bootstrap, topic)
        reg = await load_registry(bootstrap, topic) if verifier is None else \
            (await load_verified(bootstrap, topic, verifier))[0]
        if must_exist and node not in reg:
            from faultwatch.core.names import did_you_mean
            from faultwatch.errors import NotFoundError

            raise NotFoundError(f"node {node!r} is not in the registry {topic}: nothing to "
                                f"{must_exist}{did_you_mean(node, reg)}; nothing written "
                                "(--force writes the record anyway)")
        rec = make(reg.get(node), node, time.time())
        await write_records(bootstrap, topic, [rec], signer=signer)
        return rec

    try:
        return asyncio.run(main())
    except BROKER_ERRORS as e:
        raise broker_error(e, bootstrap, f"changing node {node} in {topic}") from None
