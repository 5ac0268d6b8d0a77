"""Lemon nodes across the fleet: every processor worker reads the whole incidents topic (no
consumer group) from one lemon window back into a LemonWatch (core/lemons.py); the worker
that owns signals partition 0 publishes the `lemon-node` decisions (one publisher: a
rebalance may briefly give two, whose decisions share their ids). Embedded mode and the
in-process fleet feed the same LemonFeed with the records they publish."""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Awaitable, Callable
from typing import Any

from faultwatch.core.events import Decision
from faultwatch.core.lemons import LemonWatch, blames, lemon_decision
from faultwatch.core.policy import Policy
from faultwatch.errors import DecodeError
from faultwatch.eventlog import log_event
from faultwatch.kafka import clients
from faultwatch.kafka.errors import BROKER_ERRORS
from faultwatch.wire.incidents import decode_ledger

RETRY_FIRST_S, RETRY_MAX_S = 1.0, 30.0
POLL_MS = 500
RETRY_BACKOFF_MS = 1000


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


async def follow_incidents(bootstrap: str, topic: str, feed: LemonFeed,
                           policy: Callable[[], tuple[Policy, str]],
                           publish: Callable[[list[Decision]], Awaitable[Any]],
                           stop: asyncio.Event | None = None) -> None:
    """Read `topic` from one lemon window back (offsets for that time), then follow it into
    `feed`; decisions found once caught up go to `publish` (the shell decides whether this
    worker is the one that publishes). A broker error restarts from the window's start after
    a backoff (the watch ignores incidents it has seen)."""
    from aiokafka import TopicPartition

    stop = stop or asyncio.Event()
    backoff = RETRY_FIRST_S
    while not stop.is_set():
        consumer: Any = None
        try:
            consumer = clients.consumer(
                bootstrap_servers=bootstrap, group_id=None, enable_auto_commit=False,
                client_id=f"faultwatch-lemons-{uuid.uuid4().hex[:6]}",
                retry_backoff_ms=RETRY_BACKOFF_MS)
            await consumer.start()
            parts = consumer.partitions_for_topic(topic)
            if not parts:  # not created yet (the worker creates it at start)
                await consumer.stop()
                consumer = None
                try:
                    await asyncio.wait_for(stop.wait(), backoff)
                except TimeoutError:
                    pass
                continue
            tps = [TopicPartition(topic, p) for p in sorted(parts)]
            consumer.assign(tps)
            since_ms = int((time.time() - policy()[0].lemon_window_s) * 1000)
            found = await consumer.offsets_for_times(dict.fromkeys(tps, since_ms))
            for tp in tps:
                at = found.get(tp)
                if at is None:
                    await consumer.seek_to_end(tp)
                else:
                    consumer.seek(tp, at.offset)
            end = await consumer.end_offsets(tps)
            caught_up = False
            log_event("incidents_following", topic=topic, partitions=len(tps))
            while not stop.is_set():
                batch = await consumer.getmany(timeout_ms=POLL_MS)
                out: list[Decision] = []
                pol, rv = policy()
                for msgs in batch.values():
                    for m in msgs:
                        out += feed.take(m.value, time.time(), pol, rv, emit=caught_up,
                                         where=f"{m.topic}[{m.partition}]@{m.offset}")
                if out:
                    await publish(out)
                if not caught_up and all([await consumer.position(tp) >= end[tp]
                                          for tp in tps]):
                    caught_up = True
                    log_event("incidents_loaded", topic=topic,
                              lemons=len(feed.lemons(time.time())))
                backoff = RETRY_FIRST_S
        except asyncio.CancelledError:
            raise
        except BROKER_ERRORS as e:
            log_event("incidents_follow_failed", topic=topic, retry_in_s=backoff,
                      error=f"{type(e).__name__}: {e}")
            try:
                await asyncio.wait_for(stop.wait(), backoff)
            except TimeoutError:
                pass
            backoff = min(RETRY_MAX_S, backoff * 2)
        finally:
            if consumer is not None:
                await consumer.stop()
