"""`faultwatch actuate`'s Kafka loop: wait calmly for the nodes topic, read the registry, act on
each node's latest record, then follow decisions and the registry until stopped.

A topic that is missing or that the principal may not read is asked about every
`nodes_retry_s` (never in a tight loop: aiokafka, assigned a topic it may not describe,
refreshes its metadata without pause and logs an error each time, ~690 lines a second), with
one `actuate_waiting_for_topic` line per state change and `actuate_topic_ready` when it is
there; a stop (SIGTERM) ends every wait at once."""

from __future__ import annotations

import asyncio
import contextlib
import time
import uuid
from collections.abc import Awaitable, Callable
from typing import Any

from faultwatch.actuate.backend import Backend
from faultwatch.actuate.journal import Journal
from faultwatch.actuate.runner import ActuateConfig, Actuator
from faultwatch.core.registry import NodeRecord
from faultwatch.eventlog import log_event
from faultwatch.trust.replay import ReplayGuard

Why = tuple[str, str]  # (reason, detail): why a topic cannot be read yet


class TopicWatch:
    """One line per state change of a topic we wait for (not one per try)."""

    def __init__(self, topic: str, retry_s: float) -> None:
        self.topic, self.retry_s = topic, retry_s
        self.why: Why | None = None
        self.since = 0.0

    def saw(self, why: Why | None, now: float) -> None:
        if why == self.why:
            return
        if why is None:
            log_event("actuate_topic_ready", topic=self.topic,
                      waited_s=round(now - self.since, 1))
        else:
            if self.why is None:
                self.since = now
            log_event("actuate_waiting_for_topic", topic=self.topic, reason=why[0],
                      detail=why[1], retry_s=self.retry_s)
        self.why = why


async def sleep_or_stop(stop: asyncio.Event, seconds: float) -> None:
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(stop.wait(), seconds)


async def readable(admin: Any, topic: str, create: bool) -> Why | None:
    """None when this principal sees `topic`; else why not. With `create`, a missing topic
    is created (compacted, one partition) where the principal may."""
    from faultwatch.kafka.admin import (
        TOPIC_AUTHORIZATION_FAILED,
        TopicNotCreated,
        ensure_compacted_with,
    )
    from faultwatch.kafka.errors import BROKER_ERRORS

    try:
        if topic in set(await admin.list_topics()):
            return None
        if not create:
            return ("missing_or_not_authorized",
                    "not listed for this principal: missing, or no Describe ACL")
        if await ensure_compacted_with(admin, topic):
            return None
        return ("not_authorized", "it exists, but this principal may not describe it")
    except TopicNotCreated as e:
        if e.code == TOPIC_AUTHORIZATION_FAILED:
            return ("missing_or_not_authorized",
                    "not listed for this principal and it may not create it: an admin "
                    "creates the topics and ACLs (faultwatch kafka acls --apply)")
        return ("not_created", str(e)[:300])
    except BROKER_ERRORS as e:
        return ("broker_error", type(e).__name__)


async def wait_readable(check: Callable[[], Awaitable[Why | None]], watch: TopicWatch,
                        stop: asyncio.Event) -> bool:
    """Ask `check` every retry_s until the topic is readable (True) or `stop` is set."""
    while not stop.is_set():
        why = await check()
        watch.saw(why, time.time())
        if why is None:
            return True
        await sleep_or_stop(stop, watch.retry_s)
    return False


async def publish_acted(act: Actuator, topic: str, producer: Any) -> int:
    """What the actuator did since the last call, on the acted topic (key: the decision), for
    `faultwatch report`. Best effort: a broker error keeps them for the next call."""
    from faultwatch.kafka.errors import BROKER_ERRORS
    from faultwatch.wire.incidents import encode_acted

    sent = 0
    while act.acted:
        a, result, ts = act.acted[0]
        try:
            await producer.send_and_wait(topic, encode_acted(
                a.decision, a.job, a.node, a.kind, act.backend.name, result, ts),
                key=a.decision.encode())
        except BROKER_ERRORS as e:
            if not act.acted_failing:  # one line per outage (the topic may not exist yet)
                log_event("produce_failed", what="acted", pending=len(act.acted),
                          error=f"{type(e).__name__}: {e}")
            act.acted_failing = True
            return sent
        act.acted_failing = False
        act.acted.popleft()
        sent += 1
    return sent


async def run(backend: Backend, cfg: ActuateConfig, stop: asyncio.Event | None = None) -> None:
    """Consume <prefix>nodes (from the beginning, no group) and <prefix>decisions (consumer
    group, offsets committed once the actions are journaled) until `stop` is set. The
    decisions topic is the processor's to create (with its partition count): until it
    exists only the registry is acted on."""
    from aiokafka import TopicPartition

    from faultwatch.kafka import calm as broker_calm
    from faultwatch.kafka import clients
    from faultwatch.registry.store import write_records
    from faultwatch.trust.decisions import decision_verifier
    from faultwatch.trust.keys import load_signing_key, load_trust
    from faultwatch.trust.records import (
        NODE_RECORD,
        DecisionGate,
        RecordGate,
        signer_for,
        verifier_for,
    )
    from faultwatch.wire.topics import Topics

    stop = stop or asyncio.Event()
    gate = DecisionGate(decision_verifier(), log_event)  # $FAULTWATCH_TRUST_FILE (or HMAC)
    gate.announce()
    node_gate = RecordGate("node_record", verifier_for(NODE_RECORD, load_trust()), log_event)
    node_gate.announce()
    signer = signer_for(NODE_RECORD, load_signing_key()) if cfg.write_registry else None
    topics = Topics(cfg.prefix)
    ntopic = topics.nodes
    journal = Journal(cfg.state_file)
    seen = cfg.state_file.with_name(cfg.state_file.name + ".seen")
    act = Actuator(backend, journal, cfg,
                   ReplayGuard("decision", cfg.max_decision_age_s, seen, log_event))
    calm = broker_calm.install()  # aiokafka's per-retry errors: one line per state change
    backoff = broker_calm.client_backoff()  # ... and retries at most once a second
    admin = clients.admin(bootstrap_servers=cfg.bootstrap, request_timeout_ms=30_000,
                          **backoff)
    producer = clients.producer(bootstrap_servers=cfg.bootstrap, acks="all", **backoff)
    nodes_c: Any = None
    dec_c: Any = None
    try:
        await admin.start()
        await producer.start()
        nwatch = TopicWatch(ntopic, cfg.nodes_retry_s)
        if not await wait_readable(lambda: readable(admin, ntopic, create=True), nwatch,
                                   stop):
            return
        nodes_c = clients.consumer(bootstrap_servers=cfg.bootstrap, group_id=None,
                                   enable_auto_commit=False,
                                   client_id=f"faultwatch-actuate-nodes-{uuid.uuid4().hex[:6]}",
                                   **backoff)
        await nodes_c.start()
        tp = TopicPartition(ntopic, 0)
        nodes_c.assign([tp])
        await nodes_c.seek_to_beginning(tp)
        end = (await nodes_c.end_offsets([tp]))[tp]

        async def pump_nodes(timeout_ms: int, plan: bool = True) -> None:
            batch = await nodes_c.getmany(timeout_ms=timeout_ms)
            for msgs in batch.values():
                for m in msgs:
                    act.take_node(m.value, time.time(), node_gate, topic=m.topic,
                                  partition=m.partition, offset=m.offset, plan=plan)

        # the registry as it is, before decisions: each node's latest record, not its history
        while not stop.is_set() and await nodes_c.position(tp) < end:
            await pump_nodes(cfg.poll_ms, plan=False)
        now = time.time()
        act.plan_registry(now)
        act.seed_drained(now)
        log_event("actuate_started", backend=backend.name, nodes=len(act.registry),
                  group=cfg.group, state_file=str(cfg.state_file),
                  replaying=len(journal.pending))
        dwatch = TopicWatch(topics.decisions, 2.0)
        next_topic_check = polled = 0.0
        while not stop.is_set():
            batch: dict[Any, list[Any]] = {}
            if dec_c is None and time.monotonic() >= next_topic_check:
                next_topic_check = time.monotonic() + dwatch.retry_s
                why = await readable(admin, topics.decisions, create=False)
                dwatch.saw(why, time.time())
                if why is None:
                    dec_c = clients.consumer(
                        topics.decisions, bootstrap_servers=cfg.bootstrap, group_id=cfg.group,
                        enable_auto_commit=False, auto_offset_reset="earliest",
                        client_id=f"faultwatch-actuate-{uuid.uuid4().hex[:6]}", **backoff)
                    await dec_c.start()
                    log_event("actuate_following", topic=topics.decisions)
            if dec_c is not None:
                await pump_nodes(0)
                batch = await dec_c.getmany(timeout_ms=cfg.poll_ms)
            else:
                await pump_nodes(cfg.poll_ms)
            ups: list[NodeRecord] = []
            for msgs in batch.values():
                for m in msgs:
                    ups.extend(act.take_decision(m.value, time.time(), gate, topic=m.topic,
                                                 partition=m.partition, offset=m.offset))
            if ups:
                await write_records(cfg.bootstrap, ntopic, ups, signer=signer)
            now = time.time()
            if now - polled >= broker_calm.POLL_S:
                polled = now
                calm.poll(now)
            act.tick(now)
            act.check_release(now)
            await asyncio.to_thread(act.run_due, now)
            await publish_acted(act, topics.acted, producer)
            if batch and dec_c is not None:
                await dec_c.commit()  # every action of these records is journaled
    finally:
        for c in (dec_c, nodes_c, producer):
            if c is not None:
                with contextlib.suppress(Exception):
                    await c.stop()
        with contextlib.suppress(Exception):
            await admin.close()
        journal.close()


async def run_until_stopped(backend: Backend, cfg: ActuateConfig, stop: asyncio.Event,
                            grace_s: float = 5.0) -> None:
    """`run`, ended at most `grace_s` after `stop` is set (a SIGTERM never needs a SIGKILL:
    a call stuck on the broker is cancelled; the journal makes the restart safe)."""
    task = asyncio.create_task(run(backend, cfg, stop))
    stopped = asyncio.create_task(stop.wait())
    await asyncio.wait({task, stopped}, return_when=asyncio.FIRST_COMPLETED)
    if not task.done():
        done, _ = await asyncio.wait({task}, timeout=grace_s)
        if not done:
            log_event("actuate_stop_forced", grace_s=grace_s)
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
    stopped.cancel()
    if task.done() and not task.cancelled():
        task.result()  # its error, if any
