"""Rule sets distributed through Kafka: `faultwatch rules push` and the processors' watcher.

A pushed rule set is one record on the compacted topic `<prefix>rules` (key `ruleset`):

    {"v": 1, "version": "<content hash>", "files": [{"name": "x.yaml", "text": "..."}],
     "pushed_at": 1714557600.0, "builtin": true}

Every processor worker reads that topic from the beginning with a plain consumer (no group:
each worker needs every record), validates the files exactly as `faultwatch rules check`
does, and swaps its matcher, policy and rules version when the set is valid. An invalid set
(e.g. written by an old client that skipped validation) is refused with its `path:line`
errors in a `rules_rejected` event, and the last good set stays in effect. A tombstone (the
key with no value) reverts the worker to the rule files it was started with.

Kafka and Faust are imported lazily: `faultwatch rules push` (in faultwatch/cli.py) calls `push`.
"""

from __future__ import annotations

import asyncio
import dataclasses
import os
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import orjson

from faultwatch.core.events import Line, Match
from faultwatch.core.policy import Policy
from faultwatch.errors import BrokerError, DecodeError, FaultwatchError, RuleError, RuleProblem
from faultwatch.logs import log_event
from faultwatch.rules import Matcher, RuleSet
from faultwatch.rules.loader import merge_texts
from faultwatch.topics import Topics

if TYPE_CHECKING:
    import faust

    from faultwatch.streams.app import ProcessorConfig

RULESET_KEY = b"ruleset"
RECORD_VERSION = 1
MAX_RECORD_BYTES = 8 << 20  # rule files are <= 1 MiB each; the record is gzip-compressed
CATCH_UP_TIMEOUT_S = 15.0  # how long a starting worker waits for the topic's current set
RETRY_S = 2.0


# ---- the record ---------------------------------------------------------------------------

def read_rule_files(paths: Sequence[str | Path]) -> tuple[list[tuple[str, str]],
                                                          list[RuleProblem]]:
    """(path, text) of each file, and a problem for each file that cannot be read."""
    files: list[tuple[str, str]] = []
    problems: list[RuleProblem] = []
    for p in paths:
        try:
            files.append((str(p), Path(p).read_text(encoding="utf-8")))
        except (OSError, UnicodeDecodeError) as e:
            problems.append(RuleProblem(str(p), 1, f"cannot read rule file: {e}"))
    return files, problems


def build_record(paths: Sequence[str | Path], *, builtin: bool = True,
                 now: float | None = None) -> tuple[bytes, RuleSet]:
    """The rules-topic record for these files, or RuleError with every problem (path:line)."""
    files, problems = read_rule_files(paths)
    if problems:
        raise RuleError(problems)
    ruleset, problems = merge_texts(files, builtin=builtin)
    if problems:
        raise RuleError(problems)
    record = orjson.dumps({
        "v": RECORD_VERSION, "version": ruleset.version,
        "files": [{"name": os.path.basename(name), "text": text} for name, text in files],
        "pushed_at": time.time() if now is None else now, "builtin": builtin})
    return record, ruleset


def ruleset_of_record(value: bytes) -> tuple[RuleSet, dict[str, Any]]:
    """(rule set, decoded record) of a rules-topic record.

    Raises DecodeError for a record that is not a rule set and RuleError (problems named by
    the pushed files' names) for a rule set that does not validate.
    """
    try:
        d = orjson.loads(value)
    except orjson.JSONDecodeError as e:
        raise DecodeError(f"rules record is not JSON: {e}") from None
    if not isinstance(d, dict) or d.get("v") != RECORD_VERSION:
        raise DecodeError(f"unsupported rules record (expected an object with v={RECORD_VERSION})")
    raw_files = d.get("files")
    if not isinstance(raw_files, list) or not all(
            isinstance(f, dict) and isinstance(f.get("name"), str)
            and isinstance(f.get("text"), str) for f in raw_files):
        raise DecodeError("rules record: files must be a list of {name, text} strings")
    files = [(f["name"], f["text"]) for f in raw_files]
    ruleset, problems = merge_texts(files, builtin=d.get("builtin", True) is not False)
    if problems:
        raise RuleError(problems)
    return ruleset, d


# ---- push ---------------------------------------------------------------------------------

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


# ---- the processors' side -----------------------------------------------------------------

async def assign_topic(consumer: Any, topic: str) -> list[Any] | None:
    """Assign every partition of `topic` to a started group-less consumer; None if missing."""
    from aiokafka import TopicPartition

    if topic not in await consumer.topics():
        return None
    first = [TopicPartition(topic, 0)]
    consumer.assign(first)
    await consumer.end_offsets(first)  # a request about the topic brings its metadata
    parts = consumer.partitions_for_topic(topic) or {0}
    tps = [TopicPartition(topic, p) for p in sorted(parts)]
    if len(tps) > 1:
        consumer.assign(tps)
    return tps


class LiveMatcher:
    """The matcher in effect in a worker (core.matching.LineMatcher); swapped on a push."""

    def __init__(self, matcher: Matcher) -> None:
        self.matcher = matcher

    def match_lines(self, lines: Sequence[Line], *, default_rank: int | None = None) -> Any:
        return self.matcher.match_lines(lines, default_rank=default_rank)

    def match_exit(self, exit_code: int, signal: int | None, ts: float) -> Match | None:
        return self.matcher.match_exit(exit_code, signal, ts)


def cli_overrides(ruleset: RuleSet, policy: Policy) -> dict[str, Any]:
    """The policy keys a worker's flags changed: `policy` minus what its rule files imply."""
    base = Policy().with_overrides(dict(ruleset.policy))
    return {f.name: getattr(policy, f.name) for f in dataclasses.fields(Policy)
            if getattr(policy, f.name) != getattr(base, f.name)}


class RulesWatcher:
    """Follows the rules topic and swaps a worker's matcher, policy and rules version."""

    def __init__(self, bootstrap: str, topic: str, live: Any, holder: LiveMatcher,
                 initial: RuleSet, overrides: dict[str, Any],
                 log: Callable[..., None] = log_event) -> None:
        self.bootstrap, self.topic = bootstrap, topic
        self.live, self.holder = live, holder
        self.initial, self.overrides = initial, dict(overrides)
        self.initial_policy = live.policy
        self.ruleset = initial
        self.next_offsets: dict[int, int] = {}
        self._log = log

    # -- applying records (synchronous: matcher, policy and version change together) --------
    def apply(self, value: bytes | None, where: str = "") -> bool:
        """Swap to the rule set in `value` if valid (None reverts to the startup rules)."""
        if value is None:
            self._swap(self.initial, Matcher(self.initial), self.initial_policy, where,
                       "startup")
            return True
        try:
            rs, rec = ruleset_of_record(value)
            policy = Policy().with_overrides(dict(rs.policy)).with_overrides(self.overrides)
            matcher = Matcher(rs)
        except RuleError as e:
            self._reject(where, [str(p) for p in e.problems], value)
            return False
        except FaultwatchError as e:  # DecodeError, ConfigError
            self._reject(where, [str(e)], value)
            return False
        except Exception as e:  # noqa: BLE001 - e.g. a pattern no engine compiles
            self._reject(where, [f"{type(e).__name__}: {e}"], value)
            return False
        if rec.get("version") and rec["version"] != rs.version:
            # pusher and worker differ (e.g. another faultwatch release's built-in rules)
            self._log("rules_version_differs", pushed=rec["version"], computed=rs.version)
        self._swap(rs, matcher, policy, where, "topic")
        return True

    def _swap(self, rs: RuleSet, matcher: Matcher, policy: Policy, where: str,
              source: str) -> None:
        old = self.live.rules_version
        self.holder.matcher = matcher
        self.live.policy = policy
        self.live.rules_version = rs.version
        self.ruleset = rs
        self._log("rules_loaded", version=rs.version, previous=old, rules=len(rs.rules),
                  source=source, at=where or None)

    def _reject(self, where: str, errors: list[str], value: bytes) -> None:
        pushed = None
        try:
            d = orjson.loads(value)
            pushed = d.get("version") if isinstance(d, dict) else None
        except orjson.JSONDecodeError:
            pass
        self._log("rules_rejected", version=pushed, at=where or None,
                  kept=self.live.rules_version, count=len(errors), errors=" | ".join(errors))

    # -- reading the topic ---------------------------------------------------------------
    async def _consumer(self) -> Any:
        from aiokafka import AIOKafkaConsumer

        consumer = AIOKafkaConsumer(bootstrap_servers=self.bootstrap, group_id=None,
                                    enable_auto_commit=False, auto_offset_reset="earliest",
                                    fetch_max_bytes=MAX_RECORD_BYTES * 2,
                                    max_partition_fetch_bytes=MAX_RECORD_BYTES)
        await consumer.start()
        try:
            tps: list[Any] | None = None
            for _ in range(20):
                tps = await assign_topic(consumer, self.topic)
                if tps:
                    break
                await asyncio.sleep(0.25)
            if not tps:
                raise BrokerError(f"topic {self.topic} does not exist")
            for tp in tps:
                if tp.partition in self.next_offsets:
                    consumer.seek(tp, self.next_offsets[tp.partition])
                else:
                    await consumer.seek_to_beginning(tp)
        except BaseException:
            await consumer.stop()
            raise
        return consumer

    async def catch_up(self) -> None:
        """Apply the newest valid rule set on the topic now (older ones only as fallbacks)."""
        consumer = await self._consumer()
        try:
            tps = list(consumer.assignment())
            end = await consumer.end_offsets(tps)
            pending: list[tuple[str, bytes | None]] = []
            async def behind() -> bool:
                return any([await consumer.position(tp) < end[tp] for tp in tps])

            while await behind():
                batch = await consumer.getmany(timeout_ms=500)
                for tp, msgs in batch.items():
                    for m in msgs:
                        pending.append((f"{tp.topic}[{tp.partition}]@{m.offset}", m.value))
                        self.next_offsets[tp.partition] = m.offset + 1
            for tp in tps:
                self.next_offsets.setdefault(tp.partition, end[tp])
        finally:
            await consumer.stop()
        for where, value in reversed(pending):  # the newest that is valid wins
            if self.apply(value, where):
                break

    def catch_up_blocking(self, timeout_s: float = CATCH_UP_TIMEOUT_S) -> None:
        """catch_up() from synchronous code (before the worker's loop runs), bounded in time."""
        errors: list[BaseException] = []

        def run() -> None:
            try:
                asyncio.run(asyncio.wait_for(self.catch_up(), timeout_s))
            except BaseException as e:  # noqa: BLE001 - reported below
                errors.append(e)

        t = threading.Thread(target=run, name="faultwatch-rules-catch-up", daemon=True)
        t.start()
        t.join(timeout_s + 5)
        if errors or t.is_alive():
            err = errors[0] if errors else TimeoutError("catch-up did not finish")
            self._log("rules_watch_error", topic=self.topic, phase="startup",
                      error=f"{type(err).__name__}: {err}")

    async def run(self) -> None:
        """Follow the topic forever (reconnecting after errors), applying each new record."""
        while True:
            consumer = None
            try:
                consumer = await self._consumer()
                while True:
                    batch = await consumer.getmany(timeout_ms=1000)
                    for tp, msgs in batch.items():
                        for m in msgs:
                            self.next_offsets[tp.partition] = m.offset + 1
                        if msgs:  # several records at once: the newest valid one wins
                            for m in reversed(msgs):
                                if self.apply(m.value, f"{tp.topic}[{tp.partition}]@{m.offset}"):
                                    break
            except asyncio.CancelledError:
                raise
            except Exception as e:  # noqa: BLE001 - keep following; the last good set stays
                self._log("rules_watch_error", topic=self.topic,
                          error=f"{type(e).__name__}: {e}")
                await asyncio.sleep(RETRY_S)
            finally:
                if consumer is not None:
                    await consumer.stop()


def attach_rules_watcher(app: faust.App, cfg: ProcessorConfig, live: Any) -> LiveMatcher:
    """The worker's swappable matcher; loads the rules topic's current set now, then follows
    the topic in a task of `app`. `live` needs `policy` and `rules_version` attributes."""
    holder = LiveMatcher(Matcher(cfg.ruleset))
    overrides = getattr(cfg, "policy_overrides", None) or cli_overrides(cfg.ruleset, cfg.policy)
    watcher = RulesWatcher(cfg.bootstrap, cfg.topics.rules, live, holder, cfg.ruleset,
                           overrides)
    watcher.catch_up_blocking()

    async def rules_watcher() -> None:
        await watcher.run()

    app.task(rules_watcher)
    return holder
