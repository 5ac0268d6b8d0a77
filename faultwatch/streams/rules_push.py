"""`faultwatch rules push`: validate rule files and publish them on the rules topic.
aiokafka is imported lazily (the CLI imports this module to register the command)."""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from faultwatch.errors import BrokerError, FaultwatchError, RuleError
from faultwatch.rules import RuleSet
from faultwatch.streams.rules_record import MAX_RECORD_BYTES, RULESET_KEY, build_record
from faultwatch.topics import DEFAULT_PREFIX, Topics


async def _ensure_rules_topic(bootstrap: str, topics: Topics, timeout_s: float) -> None:
    """Create only the compacted rules topic (the other topics' partition counts belong to
    `faultwatch process --partitions`, so push must not create them)."""
    from aiokafka.admin import AIOKafkaAdminClient, NewTopic
    from aiokafka.errors import TopicAlreadyExistsError

    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap,
                                request_timeout_ms=int(timeout_s * 1000))
    await asyncio.wait_for(admin.start(), timeout_s)
    try:
        if topics.rules in set(await admin.list_topics()):
            return
        try:
            await admin.create_topics([NewTopic(topics.rules, num_partitions=1,
                                                replication_factor=1,
                                                topic_configs={"cleanup.policy": "compact"})])
        except TopicAlreadyExistsError:
            pass
    finally:
        await admin.close()


async def publish_record(bootstrap: str, topic: str, value: bytes | None,
                         key: bytes = RULESET_KEY, timeout_s: float = 30.0) -> None:
    """Write one record to the rules topic (acks=all). Also used by tests to bypass push."""
    from aiokafka import AIOKafkaProducer

    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, acks="all",
                                compression_type="gzip", max_request_size=MAX_RECORD_BYTES,
                                request_timeout_ms=int(timeout_s * 1000))
    await asyncio.wait_for(producer.start(), timeout_s)
    try:
        await asyncio.wait_for(producer.send_and_wait(topic, value=value, key=key), timeout_s)
    finally:
        await producer.stop()


async def push(bootstrap: str, paths: Sequence[str | Path], *, topics: Topics | None = None,
               builtin: bool = True, timeout_s: float = 30.0) -> RuleSet:
    """Validate the files (RuleError, nothing published) and publish them as the rule set."""
    topics = topics or Topics()
    record, ruleset = build_record(paths, builtin=builtin)
    try:
        await _ensure_rules_topic(bootstrap, topics, timeout_s)
        await publish_record(bootstrap, topics.rules, record, timeout_s=timeout_s)
    except FaultwatchError:
        raise
    except Exception as e:  # noqa: BLE001 - any Kafka failure: one clear message
        raise BrokerError(f"could not publish the rule set to {topics.rules} at {bootstrap}: "
                          f"{type(e).__name__}: {e}") from None
    return ruleset


def cmd_rules_push(args: argparse.Namespace) -> int:
    """`faultwatch rules push FILE... --bootstrap B [--topic-prefix P]`."""
    try:
        build_record(args.files, builtin=not args.no_builtin)  # validate before needing Kafka
    except RuleError as e:
        for p in e.problems:
            print(p, file=sys.stderr)
        print(f"not pushed: {len(e.problems)} problem(s)", file=sys.stderr)
        return 1
    if not args.bootstrap:
        raise FaultwatchError("no Kafka bootstrap: pass --bootstrap HOST:PORT or set "
                              "FAULTWATCH_BOOTSTRAP")
    topics = Topics(args.topic_prefix)
    rs = asyncio.run(push(args.bootstrap, args.files, topics=topics,
                          builtin=not args.no_builtin, timeout_s=args.timeout_s))
    print(f"pushed rules version {rs.version} ({len(rs.rules)} rules, {len(args.files)} "
          f"file(s)) to {topics.rules}")
    return 0


def register(rsub: Any) -> None:
    """Adds `push` to the `faultwatch rules` subcommands."""
    p = rsub.add_parser("push", help="validate rule files and publish them to every processor")
    p.add_argument("files", nargs="+", metavar="FILE")
    p.add_argument("--bootstrap", default=os.environ.get("FAULTWATCH_BOOTSTRAP"),
                   help="Kafka bootstrap HOST:PORT (default $FAULTWATCH_BOOTSTRAP)")
    p.add_argument("--topic-prefix", default=os.environ.get("FAULTWATCH_TOPIC_PREFIX",
                                                            DEFAULT_PREFIX),
                   help="topic name prefix (default $FAULTWATCH_TOPIC_PREFIX or 'faultwatch.')")
    p.add_argument("--no-builtin", action="store_true",
                   help="the files replace the built-in rule set instead of extending it")
    p.add_argument("--timeout-s", type=float, default=30.0, help="Kafka timeout (seconds)")
    p.set_defaults(func=cmd_rules_push)
