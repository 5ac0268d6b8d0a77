"""The processors' side of pushed rule sets: follow the rules topic (every worker reads it
whole, no group), build each set as the `pushed` layer over the layers the worker started with
(rules/layers.py: built-in, its `--rules` files, its flags), and swap the worker's matcher,
policy and rules version together (LiveRules.swap). An invalid set is refused with its
`path:line` errors in a `rules_rejected` event and the last good set stays; a tombstone
removes the pushed layer. Only the `ruleset` key is applied: the `revision/N` keys are the
history `rules rollback` reads (rollout/rules_history.py). aiokafka is imported lazily."""

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
from faultwatch.kafka.calm import RETRY_BACKOFF_MS
from faultwatch.rollout.rules_record import RULESET_KEY, layer_of_record
from faultwatch.rules import Matcher, RuleSet
from faultwatch.rules.layers import RulesInForce, build, from_ruleset
from faultwatch.streams.records import LiveRules
from faultwatch.trust.replay import REPLAYED
from faultwatch.trust.versions import describe, older, record_version
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


def base_rules(ruleset: RuleSet, policy: Policy, rules: RulesInForce | None,
               overrides: dict[str, Any]) -> RulesInForce:
    """What a worker started with (built-in + `--rules` layers and its flags): `rules` when
    the caller built it (cli: layers.load), else one layer of an already merged set."""
    if rules is not None:
        return rules
    return from_ruleset(ruleset, overrides or cli_overrides(ruleset, policy))


class RulesWatcher:
    """Follows the rules topic and swaps a worker's rules: each valid pushed set becomes the
    `pushed` layer over the layers the worker started with (rules/layers.py)."""

    def __init__(self, bootstrap: str, topic: str, live: LiveRules,
                 base: RulesInForce | RuleSet, overrides: dict[str, Any] | None = None,
                 log: Callable[..., None] = log_event, gate: Any = None) -> None:
        from faultwatch.trust.keys import load_trust
        from faultwatch.trust.records import RULES, RecordGate, verifier_for

        self.bootstrap, self.topic = bootstrap, topic
        # rule sets are an operator's: with $FAULTWATCH_TRUST_FILE unsigned (tombstones
        # too), forged and non-operator records are refused
        self.gate = gate or RecordGate("rules", verifier_for(RULES, load_trust()), log)
        self.live = live
        if isinstance(base, RuleSet):  # a merged set (and its flags): as the built-in layer
            base = from_ruleset(base, overrides or {}, layer="builtin")
        self.base = base
        self.rules = base
        self.next_offsets: dict[int, int] = {}
        self.rejected = 0  # pushed sets refused since start
        self.last_rejected: dict[str, Any] | None = None
        self._log = log
        if live.rules is None:
            live.rules = base

    @property
    def ruleset(self) -> RuleSet:
        return self.rules.ruleset

    # -- applying records (synchronous: matcher, policy and version change together) --------
    def apply(self, value: bytes | None, where: str = "") -> bool:
        """Swap to the base layers plus the set in `value` if valid and signed (None, a
        tombstone, removes the pushed layer when nothing is verified)."""
        if not self.gate.admit_value(value, at=where or None, kept=self.live.rules_version):
            return False
        if value is None:
            self._swap(self.base, Matcher(self.base.ruleset), where)
            return True
        try:
            layer, keep_builtin, rec = layer_of_record(value, where)
            if self._replayed(rec, where):
                return False
            # `builtin: false` is honoured only from a verified operator signature
            keep_builtin = keep_builtin or not self.gate.verifying
            base = [la for la in self.base.layers if keep_builtin or la.name != "builtin"]
            rules, problems = build([*base, layer], self.base.flags)
            if rules is None:
                raise RuleError(problems)
            matcher = Matcher(rules.ruleset)
        except RuleError as e:
            self._reject(where, [str(p) for p in e.problems], value)
            return False
        except FaultwatchError as e:  # DecodeError, ConfigError
            self._reject(where, [str(e)], value)
            return False
        except Exception as e:  # noqa: BLE001 - e.g. a pattern no engine compiles
            self._reject(where, [f"{type(e).__name__}: {e}"], value)
            return False
        self._swap(rules, matcher, where)
        return True

    def _replayed(self, rec: dict[str, Any], where: str) -> bool:
        """With signatures checked: a signed rule set of a lower version (its `revision`,
        then `pushed_at`) than the one in force is an old push written again (refused,
        `replayed`)."""
        held = self.rules.layer("pushed")
        held_v = record_version(held.meta, "pushed_at", "revision") if held else None
        new_v = record_version(rec, "pushed_at", "revision")
        if not self.gate.verifying or new_v is None or not older(held_v, new_v):
            return False
        assert held_v is not None
        self.gate.refuse(REPLAYED, f"a rule set of {describe(new_v)} after one of "
                                   f"{describe(held_v)} (an old push written again)",
                         at=where or None, kept=self.live.rules_version)
        return True

    def _swap(self, rules: RulesInForce, matcher: Matcher, where: str) -> None:
        old = self.live.swap(rules, matcher)
        self.rules = rules
        pushed = rules.layer("pushed")
        meta = dict(pushed.meta) if pushed else {}
        self._log("rules_loaded", version=rules.version, previous=old,
                  rules=len(rules.ruleset.rules), source=rules.source,
                  layers="+".join(la.name for la in rules.layers),
                  push_id=meta.get("push_id"), author=meta.get("author"), at=where or None)

    def _reject(self, where: str, errors: list[str], value: bytes) -> None:
        pushed = None
        try:
            d = orjson.loads(value)
            pushed = d.get("version") if isinstance(d, dict) else None
        except orjson.JSONDecodeError:
            pass
        self.rejected += 1
        self.last_rejected = {"version": pushed, "at": where or None, "errors": errors[:10]}
        self._log("rules_rejected", version=pushed, at=where or None,
                  kept=self.live.rules_version, count=len(errors), errors=" | ".join(errors))

    # -- reading the topic ---------------------------------------------------------------
    async def _consumer(self) -> Any:
        consumer = clients.consumer(bootstrap_servers=self.bootstrap, group_id=None,
                                    enable_auto_commit=False, auto_offset_reset="earliest",
                                    fetch_max_bytes=MAX_RULESET_RECORD_BYTES * 2,
                                    max_partition_fetch_bytes=MAX_RULESET_RECORD_BYTES,
                                    retry_backoff_ms=RETRY_BACKOFF_MS)
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
                        if m.key == RULESET_KEY:  # not the revisions (rules_history.py)
                            pending.append((f"{tp.topic}[{tp.partition}]@{m.offset}",
                                            m.value))
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
                        # several records at once: the newest valid one wins (the set
                        # in force only, not the revisions' copies: rules_history.py)
                        for m in reversed([m for m in msgs if m.key == RULESET_KEY]):
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
