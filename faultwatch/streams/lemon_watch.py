"""Lemon nodes across the fleet: every processor worker reads the whole incidents topic (no
consumer group) from one lemon window back into a LemonWatch (core/lemons.py); the worker
that owns signals partition 0 publishes the `lemon-node` decisions (one publisher: a
rebalance may briefly give two, whose decisions share their ids). Embedded mode and the
in-process fleet feed the same LemonFeed with the records they publish."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

from faultwatch.core.events import Decision
from faultwatch.core.lemons import LemonWatch, blames, lemon_decision
from faultwatch.core.policy import Policy
from faultwatch.errors import DecodeError
from faultwatch.eventlog import log_event
from faultwatch.kafka.following import TopicFollower
from faultwatch.wire.incidents import decode_ledger


class LemonFeed:
    """Ledger records in, `lemon-node` decisions out (the policy's lemon_* keys, read at each
    record: a rules push changes them). `gate` (trust.records.RecordGate) refuses unsigned
    or forged records when a trust file is set."""

    def __init__(self, gate: Any = None) -> None:
        self.watch = LemonWatch()
        self.gate = gate
        self.bad = 0

    def take(self, value: bytes | None, now: float, policy: Policy, rules_version: str = "",
             emit: bool = True, where: str = "") -> list[Decision]:
        if not policy.lemon_detection:
            return []
        if self.gate is not None and not self.gate.admit_value(value, where=where):
            return []
        try:
            d, led = decode_ledger(value)
        except DecodeError as e:
            self.bad += 1
            log_event("undecodable_record", where=where, error=str(e))
            return []
        w = self.watch
        w.min_jobs, w.window_s = policy.lemon_min_jobs, policy.lemon_window_s
        found = [b for i in led.incidents for b in blames(led.job, led.run_id, i.to_dict())]
        notices = w.observe(found, now, emit)
        for n in notices:
            log_event("lemon_node", node=n.node, jobs=len(n.jobs), window_s=n.window_s,
                      action=policy.lemon_action)
        return [lemon_decision(n, policy.lemon_action, rules_version) for n in notices]

    def lemons(self, now: float) -> list[str]:
        return self.watch.lemons(now)


class IncidentsFollower(TopicFollower):
    """The incidents topic from one lemon window back into a LemonFeed; decisions found once
    caught up go to `publish`. A missing topic is asked for again after the backoff."""

    client = "lemons"
    following_event = "incidents_following"
    failed_event = "incidents_follow_failed"

    def __init__(self, bootstrap: str, topic: str, feed: LemonFeed,
                 policy: Callable[[], tuple[Policy, str]],
                 publish: Callable[[list[Decision]], Awaitable[Any]]) -> None:
        super().__init__(bootstrap, topic)
        self.feed, self.policy, self.publish = feed, policy, publish

    async def seek(self, consumer: Any, tps: list[Any]) -> None:
        """One lemon window back (offsets for that time; none: the end). Each (re)start reads
        the window again as history: nothing is emitted until caught up."""
        since_ms = int((time.time() - self.policy()[0].lemon_window_s) * 1000)
        found = await consumer.offsets_for_times(dict.fromkeys(tps, since_ms))
        for tp in tps:
            at = found.get(tp)
            if at is None:
                await consumer.seek_to_end(tp)
            else:
                consumer.seek(tp, at.offset)
        self.caught_up = False

    async def take(self, batch: Mapping[Any, list[Any]]) -> None:
        out: list[Decision] = []
        pol, rv = self.policy()
        for msgs in batch.values():
            for m in msgs:
                out += self.feed.take(m.value, time.time(), pol, rv, emit=self.caught_up,
                                      where=f"{m.topic}[{m.partition}]@{m.offset}")
        if out:
            await self.publish(out)

    def loaded(self) -> None:
        log_event("incidents_loaded", topic=self.topic, lemons=len(self.feed.lemons(time.time())))


async def follow_incidents(bootstrap: str, topic: str, feed: LemonFeed,
                           policy: Callable[[], tuple[Policy, str]],
                           publish: Callable[[list[Decision]], Awaitable[Any]],
                           stop: asyncio.Event | None = None) -> None:
    """Read `topic` from one lemon window back (offsets for that time), then follow it into
    `feed`; decisions found once caught up go to `publish` (the shell decides whether this
    worker is the one that publishes). A broker error restarts from the window's start after
    a backoff (the watch ignores incidents it has seen)."""
    await IncidentsFollower(bootstrap, topic, feed, policy, publish).run(stop)
