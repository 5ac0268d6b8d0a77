"""Creating faultwatch's topics with the partition counts and cleanup policies they need."""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any

from faultwatch.errors import BrokerError
from faultwatch.kafka import clients
from faultwatch.kafka.errors import diagnose
from faultwatch.kafka.settings import KafkaSecurity
from faultwatch.wire.topics import (
    COMPACT,
    DEFAULT_PARTITIONS,
    INCIDENTS_RETENTION_S,
    TOPICS,
    Topics,
    TopicSpec,
)

TOPIC_ALREADY_EXISTS, TOPIC_AUTHORIZATION_FAILED = 36, 29  # Kafka protocol error codes


class TopicNotCreated(BrokerError):
    """The broker refused to create a topic (CreateTopics answers per topic, it raises
    nothing): `code` is Kafka's error code, 29 when the principal may not create it."""

    def __init__(self, topic: str, code: int, message: str | None) -> None:
        from aiokafka.errors import for_code  # type: ignore[import-untyped,unused-ignore]

        name = for_code(code).__name__
        hint = (": the principal may not create it (an admin creates the topics: "
                "`faultwatch kafka acls --apply`)" if code == TOPIC_AUTHORIZATION_FAILED
                else "")
        super().__init__(f"topic {topic!r} was not created: {name}"
                         f"{f' ({message})' if message else ''}{hint}")
        self.topic, self.code = topic, code


async def _create_missing(admin: Any, new: list[Any], strict: bool = True) -> set[str]:
    """Create each topic; the names created. One that exists already is fine, any other
    answer raises TopicNotCreated; with `strict` off, a topic this principal may not create
    (or see) is skipped with one `topic_not_created` line instead (a processor, which on a
    secured cluster creates nothing: its topics are the admin's)."""
    from aiokafka.errors import TopicAlreadyExistsError  # type: ignore[import-untyped,unused-ignore]

    created: set[str] = set()
    for t in new:
        try:
            resp = await admin.create_topics([t])
        except TopicAlreadyExistsError:
            continue  # another process created it first
        for err in getattr(resp, "topic_errors", ()):
            topic, code = err[0], err[1]
            if code == 0:
                created.add(topic)
            elif code == TOPIC_AUTHORIZATION_FAILED and not strict:
                from faultwatch.eventlog import log_event

                log_event("topic_not_created", topic=topic, reason="not_authorized",
                          hint="an admin creates the topics (faultwatch kafka acls --apply)")
            elif code != TOPIC_ALREADY_EXISTS:
                raise TopicNotCreated(topic, code, err[2] if len(err) > 2 else None)
    return created


async def ensure_topics(bootstrap: str, topics: Topics, partitions: int = DEFAULT_PARTITIONS,
                        timeout_s: float = 30.0, security: KafkaSecurity | None = None,
                        incidents_retention_s: float = INCIDENTS_RETENTION_S,
                        strict: bool = True) -> None:
    """Create the topics the processor creates (TOPICS rows `created="processor"`) if
    missing, each with its row's partitions (else `partitions`: logs, signals, decisions,
    control and incidents; signals must match the job table's partition count) and config;
    the rows with `retention` (incidents, acted) drop what is older than
    `incidents_retention_s`. Raises BrokerError (TopicNotCreated for a refused creation;
    without `strict` a topic the principal may not create is skipped, logged)."""
    from aiokafka.admin import NewTopic  # type: ignore[import-untyped,unused-ignore]

    admin = clients.admin(bootstrap_servers=bootstrap, request_timeout_ms=int(timeout_s * 1000),
                          security=security)
    try:
        await asyncio.wait_for(admin.start(), timeout_s)
    except Exception as e:
        with contextlib.suppress(Exception):
            await admin.close()
        raise await diagnose(e, bootstrap, "creating topics") from e
    try:
        existing = set(await admin.list_topics())
        new = [_new_topic(NewTopic, spec, topics.prefix, partitions, incidents_retention_s)
               for spec in TOPICS
               if spec.created == "processor" and spec.name(topics.prefix) not in existing]
        await _create_missing(admin, new, strict)
    finally:
        await admin.close()


def _new_topic(new_topic: Any, spec: TopicSpec, prefix: str, partitions: int,
               retention_s: float) -> Any:
    """A NewTopic of one TOPICS row: its partition count (else `partitions`) and config."""
    config = dict(spec.config)
    if spec.retention:
        config["retention.ms"] = str(int(retention_s * 1000))
    kw: dict[str, Any] = {"topic_configs": config} if config else {}
    return new_topic(spec.name(prefix), num_partitions=spec.partitions or partitions,
                     replication_factor=1, **kw)


async def ensure_compacted_topic(bootstrap: str, topic: str, timeout_s: float = 30.0,
                                 security: KafkaSecurity | None = None) -> None:
    """Create one compacted topic of one partition if missing (the nodes topic: node updates
    are rare; the rules topic, which `rules push` creates without the processor's others)."""
    admin = clients.admin(bootstrap_servers=bootstrap, request_timeout_ms=int(timeout_s * 1000),
                          security=security)
    await asyncio.wait_for(admin.start(), timeout_s)
    try:
        await ensure_compacted_with(admin, topic)
    finally:
        await admin.close()


async def ensure_compacted_with(admin: Any, topic: str) -> bool:
    """ensure_compacted_topic with a started admin client; True when the principal sees the
    topic afterwards (False: it exists, but this principal may not describe it).
    TopicNotCreated when it is missing and may not be created here."""
    from aiokafka.admin import NewTopic  # type: ignore[import-untyped,unused-ignore]

    if topic in set(await admin.list_topics()):
        return True
    if topic in await _create_missing(admin, [NewTopic(
            topic, num_partitions=1, replication_factor=1,
            topic_configs=dict(COMPACT))]):
        return True
    return topic in set(await admin.list_topics())


async def ensure_all(bootstrap: str, topics: Topics, partitions: int = DEFAULT_PARTITIONS,
                     security: KafkaSecurity | None = None) -> None:
    """Every TOPICS row: the processor's (ensure_topics) and those their writers create
    (the nodes topic), as `kafka acls --apply` and `kafka up --secure` provision them."""
    await ensure_topics(bootstrap, topics, partitions, security=security)
    for spec in TOPICS:
        if spec.created == "writer":
            await ensure_compacted_topic(bootstrap, spec.name(topics.prefix), security=security)
