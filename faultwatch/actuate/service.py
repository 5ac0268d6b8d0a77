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


class Service:
    """One actuate process's clients and state: `open` (gates, journal, clients; the nodes
    topic waited for), `read_registry` (each node's latest record, acted on once), then `step`
    until stopped (the decisions topic followed once the processor created it), `close`."""

    def __init__(self, backend: Backend, cfg: ActuateConfig, stop: asyncio.Event) -> None:
        from faultwatch.kafka import calm as broker_calm
        from faultwatch.kafka import clients
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

        self.backend, self.cfg, self.stop = backend, cfg, stop
        self.gate = DecisionGate(decision_verifier(), log_event)  # the trust file (or HMAC)
        self.gate.announce()
        self.node_gate = RecordGate("node_record", verifier_for(NODE_RECORD, load_trust()),
                                    log_event)
        self.node_gate.announce()
        self.signer = signer_for(NODE_RECORD, load_signing_key()) if cfg.write_registry \
            else None
        self.topics = Topics(cfg.prefix)
        self.journal = Journal(cfg.state_file)
        seen = cfg.state_file.with_name(cfg.state_file.name + ".seen")
        self.act = Actuator(backend, self.journal, cfg,
                            ReplayGuard("decision", cfg.max_decision_age_s, seen, log_event))
        self.calm = broker_calm.install()  # aiokafka's per-retry errors: a line per change
        self.backoff = broker_calm.client_backoff()  # ... and retries at most once a second
        self.admin = clients.admin(bootstrap_servers=cfg.bootstrap, request_timeout_ms=30_000,
                                   **self.backoff)
        self.producer = clients.producer(bootstrap_servers=cfg.bootstrap, acks="all",
                                         **self.backoff)
        self.nodes_c: Any = None
        self.dec_c: Any = None
        self.tp: Any = None
        self.dwatch = TopicWatch(self.topics.decisions, 2.0)
        self.next_topic_check = self.polled = 0.0

    async def open(self) -> bool:
        """Start the clients and wait for the nodes topic; False when stopped first."""
        from aiokafka import TopicPartition

        from faultwatch.kafka import clients

        await self.admin.start()
        await self.producer.start()
        ntopic = self.topics.nodes
        nwatch = TopicWatch(ntopic, self.cfg.nodes_retry_s)
        if not await wait_readable(lambda: readable(self.admin, ntopic, create=True), nwatch,
                                   self.stop):
            return False
        self.nodes_c = clients.consumer(
            bootstrap_servers=self.cfg.bootstrap, group_id=None, enable_auto_commit=False,
            client_id=f"faultwatch-actuate-nodes-{uuid.uuid4().hex[:6]}", **self.backoff)
        await self.nodes_c.start()
        self.tp = TopicPartition(ntopic, 0)
        self.nodes_c.assign([self.tp])
        await self.nodes_c.seek_to_beginning(self.tp)
        return True

    async def pump_nodes(self, timeout_ms: int, plan: bool = True) -> None:
        batch = await self.nodes_c.getmany(timeout_ms=timeout_ms)
        for msgs in batch.values():
            for m in msgs:
                self.act.take_node(m.value, time.time(), self.node_gate, topic=m.topic,
                                   partition=m.partition, offset=m.offset, plan=plan)

    async def read_registry(self) -> None:
        """The registry as it is, before decisions: each node's latest record, not its
        history."""
        end = (await self.nodes_c.end_offsets([self.tp]))[self.tp]
        while not self.stop.is_set() and await self.nodes_c.position(self.tp) < end:
            await self.pump_nodes(self.cfg.poll_ms, plan=False)
        now = time.time()
        self.act.plan_registry(now)
        self.act.seed_drained(now)
        log_event("actuate_started", backend=self.backend.name, nodes=len(self.act.registry),
                  group=self.cfg.group, state_file=str(self.cfg.state_file),
                  replaying=len(self.journal.pending))

    async def follow_decisions(self) -> None:
        """Start following the decisions topic once it is readable (asked every 2 s)."""
        from faultwatch.kafka import clients

        if self.dec_c is not None or time.monotonic() < self.next_topic_check:
            return
        self.next_topic_check = time.monotonic() + self.dwatch.retry_s
        why = await readable(self.admin, self.topics.decisions, create=False)
        self.dwatch.saw(why, time.time())
        if why is None:
            self.dec_c = clients.consumer(
                self.topics.decisions, bootstrap_servers=self.cfg.bootstrap,
                group_id=self.cfg.group, enable_auto_commit=False,
                auto_offset_reset="earliest",
                client_id=f"faultwatch-actuate-{uuid.uuid4().hex[:6]}", **self.backoff)
            await self.dec_c.start()
            log_event("actuate_following", topic=self.topics.decisions)

    async def step(self) -> None:
        """One pass: read the registry and the decisions, write the registry records they
        make, plan and run what is due, say what was done, commit what is journaled."""
        from faultwatch.kafka import calm as broker_calm
        from faultwatch.registry.store import write_records

        await self.follow_decisions()
        batch: dict[Any, list[Any]] = {}
        if self.dec_c is not None:
            await self.pump_nodes(0)
            batch = await self.dec_c.getmany(timeout_ms=self.cfg.poll_ms)
        else:
            await self.pump_nodes(self.cfg.poll_ms)
        ups: list[NodeRecord] = []
        for msgs in batch.values():
            for m in msgs:
                ups.extend(self.act.take_decision(m.value, time.time(), self.gate,
                                                  topic=m.topic, partition=m.partition,
                                                  offset=m.offset))
        if ups:
            await write_records(self.cfg.bootstrap, self.topics.nodes, ups, signer=self.signer)
        now = time.time()
        if now - self.polled >= broker_calm.POLL_S:
            self.polled = now
            self.calm.poll(now)
        self.act.tick(now)
        self.act.check_release(now)
        await asyncio.to_thread(self.act.run_due, now)
        await publish_acted(self.act, self.topics.acted, self.producer)
        if batch and self.dec_c is not None:
            await self.dec_c.commit()  # every action of these records is journaled

    async def close(self) -> None:
        for c in (self.dec_c, self.nodes_c, self.producer):
            if c is not None:
                with contextlib.suppress(Exception):
                    await c.stop()
        with contextlib.suppress(Exception):
            await self.admin.close()
        self.journal.close()


async def run(backend: Backend, cfg: ActuateConfig, stop: asyncio.Event | None = None) -> None:
    """Consume <prefix>nodes (from the beginning, no group) and <prefix>decisions (consumer
    group, offsets committed once the actions are journaled) until `stop` is set. The
    decisions topic is the processor's to create (with its partition count): until it
    exists only the registry is acted on."""
    svc = Service(backend, cfg, stop or asyncio.Event())
    try:
        if not await svc.open():
            return
        await svc.read_registry()
        while not svc.stop.is_set():
            await svc.step()
    finally:
        await svc.close()


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
