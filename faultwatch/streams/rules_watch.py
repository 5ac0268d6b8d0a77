"""The processors' side of pushed rule sets: follow the rules topic (every worker reads it
whole, no group), validate each set as `faultwatch rules check` does, and swap the worker's
matcher, policy and rules version together. An invalid set is refused with its `path:line`
errors in a `rules_rejected` event and the last good set stays; a tombstone reverts to the
rule files the worker started with. aiokafka is imported lazily."""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Callable
from typing import Any

import orjson

from faultwatch.core.policy import Policy, policy_for
from faultwatch.errors import BrokerError, FaultwatchError, RuleError
from faultwatch.eventlog import log_event
from faultwatch.kafka import clients
from faultwatch.rules import Matcher, RuleSet
from faultwatch.streams.records import LiveRules
from faultwatch.streams.rules_record import ruleset_of_record
from faultwatch.wire import MAX_RULESET_RECORD_BYTES

CATCH_UP_TIMEOUT_S = 15.0  # how long a starting worker waits for the topic's current set
RETRY_S = 2.0



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


def cli_overrides(ruleset: RuleSet, policy: Policy) -> dict[str, Any]:
    """The policy keys a worker's flags changed: `policy` minus what its rule files imply."""
    base = policy_for(ruleset.policy)
    return {f.name: getattr(policy, f.name) for f in dataclasses.fields(Policy)
            if getattr(policy, f.name) != getattr(base, f.name)}


class RulesWatcher:
    """Follows the rules topic and swaps a worker's matcher, policy and rules version."""

    def __init__(self, bootstrap: str, topic: str, live: LiveRules, initial: RuleSet,
                 overrides: dict[str, Any], log: Callable[..., None] = log_event) -> None:
        self.bootstrap, self.topic = bootstrap, topic
        self.live = live
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
            policy = policy_for(rs.policy, self.overrides)
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
        self.live.matcher = matcher
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
        consumer = clients.consumer(bootstrap_servers=self.bootstrap, group_id=None,
                                    enable_auto_commit=False, auto_offset_reset="earliest",
                                    fetch_max_bytes=MAX_RULESET_RECORD_BYTES * 2,
                                    max_partition_fetch_bytes=MAX_RULESET_RECORD_BYTES)
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

    async def catch_up_bounded(self, timeout_s: float = CATCH_UP_TIMEOUT_S) -> None:
        """catch_up() within `timeout_s`; a failure is logged and the startup rules stay."""
        try:
            await asyncio.wait_for(self.catch_up(), timeout_s)
        except Exception as e:  # noqa: BLE001 - a worker starts with its own rule files
            self._log("rules_watch_error", topic=self.topic, phase="startup",
                      error=f"{type(e).__name__}: {e}")

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
