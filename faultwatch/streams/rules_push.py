"""Publishing a rule set on the rules topic (`faultwatch rules push` calls `push`); aiokafka is
imported lazily."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from faultwatch.errors import FaultwatchError
from faultwatch.kafka import clients
from faultwatch.kafka.admin import ensure_compacted_topic
from faultwatch.kafka.errors import broker_error
from faultwatch.rules import RuleSet
from faultwatch.streams.rules_record import RULESET_KEY, build_record, next_seq
from faultwatch.wire import MAX_RULESET_RECORD_BYTES
from faultwatch.wire.topics import Topics


async def publish_record(bootstrap: str, topic: str, value: bytes | None,
                         key: bytes = RULESET_KEY, timeout_s: float = 30.0) -> None:
    """Write one record to the rules topic (acks=all). Also used by tests to bypass push."""
    producer = clients.producer(bootstrap_servers=bootstrap, acks="all",
                                compression_type="gzip", max_request_size=MAX_RULESET_RECORD_BYTES,
                                request_timeout_ms=int(timeout_s * 1000))
    await asyncio.wait_for(producer.start(), timeout_s)
    try:
        await asyncio.wait_for(producer.send_and_wait(topic, value=value, key=key), timeout_s)
    finally:
        await producer.stop()


async def push(bootstrap: str, paths: Sequence[str | Path], *, topics: Topics | None = None,
               builtin: bool = True, timeout_s: float = 30.0,
               signing_key: Any = None) -> RuleSet:
    """Validate the files (RuleError, nothing published) and publish them as the rule set,
    signed with the operator's `signing_key` (trust.keys.SigningKey) when given."""
    import orjson

    from faultwatch.streams.rules_status import read_pushed

    topics = topics or Topics()
    record, ruleset = build_record(paths, builtin=builtin)
    try:
        held = await read_pushed(bootstrap, topics.rules)
    except FaultwatchError:
        raise
    except Exception as e:  # noqa: BLE001 - any Kafka failure: one clear message
        raise broker_error(e, bootstrap, f"reading the rule set in force on {topics.rules}"
                           ) from None
    # the version: one more than the set in force (followers refuse a lower one)
    fields = {**orjson.loads(record), "seq": next_seq(held)}
    if signing_key is not None:
        from faultwatch.trust.records import RULES, RecordSigner

        fields = RecordSigner(signing_key, RULES).sign_record(fields)
    record = orjson.dumps(fields)
    try:
        # only the rules topic: the others' partition counts belong to `faultwatch process
        # --partitions`, so push must not create them
        await ensure_compacted_topic(bootstrap, topics.rules, timeout_s)
        await publish_record(bootstrap, topics.rules, record, timeout_s=timeout_s)
    except FaultwatchError:
        raise
    except Exception as e:  # noqa: BLE001 - any Kafka failure: one clear message
        raise broker_error(e, bootstrap, f"publishing the rule set to {topics.rules}") from None
    return ruleset
