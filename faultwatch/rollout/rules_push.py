"""Publishing a rule set on the rules topic (`faultwatch rules push` calls `push`, `rules
rollback` calls `rollback`); aiokafka is imported lazily."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from faultwatch.errors import FaultwatchError
from faultwatch.kafka import clients
from faultwatch.kafka.admin import ensure_compacted_topic
from faultwatch.kafka.errors import broker_error
from faultwatch.rollout.rules_history import (
    Revision,
    history,
    next_revision,
    revision_key,
    rollback_target,
)
from faultwatch.rollout.rules_record import RULESET_KEY, build_record, record_of_texts
from faultwatch.rules import RuleSet
from faultwatch.wire import MAX_RULESET_RECORD_BYTES
from faultwatch.wire.topics import Topics


async def publish_record(bootstrap: str, topic: str, value: bytes | None,
                         key: bytes = RULESET_KEY, timeout_s: float = 30.0) -> None:
    """Write one record to the rules topic (acks=all). Also used by tests to bypass push."""
    await publish_records(bootstrap, topic, [(key, value)], timeout_s)


async def publish_records(bootstrap: str, topic: str,
                          records: Sequence[tuple[bytes, bytes | None]],
                          timeout_s: float = 30.0) -> None:
    """Write records to the rules topic in order (acks=all), each waited for."""
    producer = clients.producer(bootstrap_servers=bootstrap, acks="all",
                                compression_type="gzip", max_request_size=MAX_RULESET_RECORD_BYTES,
                                request_timeout_ms=int(timeout_s * 1000))
    await asyncio.wait_for(producer.start(), timeout_s)
    try:
        for key, value in records:
            await asyncio.wait_for(producer.send_and_wait(topic, value=value, key=key),
                                   timeout_s)
    finally:
        await producer.stop()


def _signed(record: bytes, signing_key: Any) -> bytes:
    if signing_key is None:
        return record
    import orjson

    from faultwatch.trust.records import RULES, RecordSigner

    return orjson.dumps(RecordSigner(signing_key, RULES).sign_record(orjson.loads(record)))


async def _revisions(bootstrap: str, topics: Topics, timeout_s: float
                     ) -> tuple[list[Revision], Revision | None]:
    from faultwatch.rollout.rules_status import read_raw

    # only the rules topic: the others' partition counts belong to `faultwatch process
    # --partitions`, so push must not create them
    await ensure_compacted_topic(bootstrap, topics.rules, timeout_s)
    return history(await read_raw(bootstrap, topics.rules))


async def _publish_revision(bootstrap: str, topics: Topics, record: bytes, revision: int,
                            timeout_s: float) -> None:
    """The revision's copy first, then the set in force: an older worker that applies every
    key of the topic (not only `ruleset`) applies the same set twice, never an old one."""
    await publish_records(bootstrap, topics.rules, [(revision_key(revision), record),
                                                    (RULESET_KEY, record)], timeout_s)


async def push(bootstrap: str, paths: Sequence[str | Path], *, topics: Topics | None = None,
               builtin: bool = True, timeout_s: float = 30.0,
               signing_key: Any = None) -> tuple[RuleSet, int]:
    """Validate the files (RuleError, nothing published) and publish them as the rule set,
    the next revision, signed with the operator's `signing_key` (trust.keys.SigningKey) when
    given: (the rule set, its revision)."""
    topics = topics or Topics()
    build_record(paths, builtin=builtin)  # invalid files: RuleError before any Kafka
    try:
        revs, current = await _revisions(bootstrap, topics, timeout_s)
        rev = next_revision(revs, current)
        record, ruleset = build_record(paths, builtin=builtin, revision=rev)
        await _publish_revision(bootstrap, topics, _signed(record, signing_key), rev,
                                timeout_s)
    except FaultwatchError:
        raise
    except Exception as e:  # noqa: BLE001 - any Kafka failure: one clear message
        raise broker_error(e, bootstrap, f"publishing the rule set to {topics.rules}") from None
    return ruleset, rev


async def read_history(bootstrap: str, topics: Topics, timeout_s: float = 30.0
                       ) -> tuple[list[Revision], Revision | None]:
    """(kept revisions, the set in force) of the rules topic (NotFoundError if missing)."""
    from faultwatch.rollout.rules_status import read_raw

    try:
        return history(await read_raw(bootstrap, topics.rules, must_exist=True))
    except FaultwatchError:
        raise
    except Exception as e:  # noqa: BLE001 - any Kafka failure: one clear message
        raise broker_error(e, bootstrap, f"reading {topics.rules}") from None


async def rollback(bootstrap: str, *, topics: Topics | None = None, to: int | None = None,
                   timeout_s: float = 30.0, signing_key: Any = None
                   ) -> tuple[Revision, Revision | None, int, RuleSet]:
    """Push the files of revision `to` (default: the one before the set in force) again as
    a new revision, signed with `signing_key`: (the revision rolled back to, the one that
    was in force, the new revision's number, its rule set)."""
    topics = topics or Topics()
    try:
        revs, current = await read_history(bootstrap, topics, timeout_s)
        target = rollback_target(revs, current, to)
        rev = next_revision(revs, current)
        record, ruleset = record_of_texts(
            target.files, builtin=target.builtin, revision=rev,
            rollback_of=current.revision if current else None, from_revision=target.revision)
        await _publish_revision(bootstrap, topics, _signed(record, signing_key), rev,
                                timeout_s)
    except FaultwatchError:
        raise
    except Exception as e:  # noqa: BLE001 - any Kafka failure: one clear message
        raise broker_error(e, bootstrap, f"rolling back the rule set on {topics.rules}"
                           ) from None
    return target, current, rev, ruleset
