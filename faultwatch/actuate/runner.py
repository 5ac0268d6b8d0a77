"""`faultwatch actuate`'s loop: consume decisions and the node registry, plan, dedupe, act."""

from __future__ import annotations

import asyncio
import time
import uuid
from collections import deque
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from faultwatch.actuate.backend import ActuateError, Backend
from faultwatch.actuate.journal import Journal
from faultwatch.actuate.plan import Action, plan_decision, plan_node
from faultwatch.core.events import Decision
from faultwatch.core.registry import (
    QUARANTINED,
    NodeRecord,
    Registry,
    RegistryPolicy,
    registry_updates,
)
from faultwatch.errors import ConfigError, DecodeError, FaultwatchError
from faultwatch.eventlog import log_event


@dataclass(frozen=True)
class ActuateConfig:
    bootstrap: str
    prefix: str
    state_file: Path
    group: str
    write_registry: bool = False  # also derive registry updates (the job stage writes them)
    max_decision_age_s: float = 600.0
    poll_ms: int = 500
    retry_s: float = 5.0
    max_tries: int = 5
    registry_policy: RegistryPolicy = RegistryPolicy()


class Actuator:
    """The pure-ish middle: decisions and node records in, actions (journaled) out."""

    def __init__(self, backend: Backend, journal: Journal, cfg: ActuateConfig) -> None:
        self.backend, self.journal, self.cfg = backend, journal, cfg
        self.registry: Registry = {}
        self.queue: deque[tuple[Action, int, float]] = deque()  # action, tries, not before
        self.queued: set[str] = set()
        for a in journal.pending.values():  # begun before a crash: replay
            log_event("actuate_replay", key=a.key)
            self._enqueue(a, replay=True)

    def _enqueue(self, a: Action, replay: bool = False) -> None:
        if a.key in self.queued or (not replay and self.journal.is_done(a.key)):
            return
        self.queued.add(a.key)
        self.queue.append((a, 0, 0.0))

    def on_decision(self, dec: Decision, now: float, where: str) -> list[NodeRecord]:
        """Plan a decision's actions; return the registry records it changes (to publish)."""
        if now - dec.ts > self.cfg.max_decision_age_s:
            log_event("actuate_decision_too_old", decision=dec.id, where=where,
                      age_s=round(now - dec.ts, 1))
            return []
        try:
            actions = plan_decision(dec)
        except ConfigError as e:
            log_event("actuate_decision_rejected", decision=dec.id[:80], where=where,
                      error=str(e))
            return []
        ups: list[NodeRecord] = []
        if actions and self.cfg.write_registry:
            ups = registry_updates(dec, self.registry, now, self.cfg.registry_policy)
            for rec in ups:
                self.registry[rec.node] = rec
        for a in actions:
            self._enqueue(a)
        return ups

    def on_node(self, rec: NodeRecord, now: float) -> None:
        self.registry[rec.node] = rec
        try:
            for a in plan_node(rec, now):
                self._enqueue(a)
        except ConfigError as e:
            log_event("actuate_node_rejected", node=rec.node[:80], error=str(e))

    def tick(self, now: float) -> None:
        """Quarantines that expired since: release them (keyed by their end time)."""
        for rec in list(self.registry.values()):
            if rec.state == QUARANTINED and rec.until is not None and now >= rec.until:
                self.on_node(rec, now)

    def run_due(self, now: float) -> int:
        """Run every queued action that is due, in order; returns how many ran."""
        ran = 0
        for _ in range(len(self.queue)):
            a, tries, not_before = self.queue.popleft()
            if not_before > now:
                self.queue.append((a, tries, not_before))
                continue
            if a.key not in self.journal.pending:
                self.journal.begin(a)
            try:
                result = self.backend.apply(a)
            except (ActuateError, FaultwatchError) as e:
                tries += 1
                if tries >= self.cfg.max_tries:
                    log_event("actuate_gave_up", backend=self.backend.name, kind=a.kind,
                              node=a.node, decision=a.decision, tries=tries, error=str(e))
                    self.journal.done(a, f"gave up: {e}")
                    self.queued.discard(a.key)
                else:
                    log_event("actuate_retry", backend=self.backend.name, kind=a.kind,
                              node=a.node, decision=a.decision, tries=tries, error=str(e))
                    self.queue.append((a, tries, now + self.cfg.retry_s * 2 ** (tries - 1)))
                continue
            self.journal.done(a, result)
            self.queued.discard(a.key)
            ran += 1
            log_event("actuated", backend=self.backend.name, kind=a.kind, node=a.node,
                      decision=a.decision, rule=a.rule, job=a.job, result=result)
        return ran


async def run(backend: Backend, cfg: ActuateConfig, stop: asyncio.Event | None = None) -> None:
    """Consume <prefix>nodes (from the beginning, no group) and <prefix>decisions (consumer
    group, offsets committed once the actions are journaled) until `stop` is set. The
    decisions topic is the processor's to create (with its partition count): until it
    exists only the registry is acted on."""
    from aiokafka import TopicPartition

    from faultwatch.kafka import clients
    from faultwatch.kafka.admin import ensure_compacted_topic
    from faultwatch.nodes.store import write_records
    from faultwatch.wire import decode_decision, decode_node
    from faultwatch.wire.signing import DecisionGate, load_keyring
    from faultwatch.wire.topics import Topics

    stop = stop or asyncio.Event()
    gate = DecisionGate(load_keyring(), log_event)  # $FAULTWATCH_DECISION_KEY[_FILE]
    gate.announce()
    topics = Topics(cfg.prefix)
    ntopic = topics.nodes
    await ensure_compacted_topic(cfg.bootstrap, ntopic)
    journal = Journal(cfg.state_file)
    act = Actuator(backend, journal, cfg)
    admin = clients.admin(bootstrap_servers=cfg.bootstrap, request_timeout_ms=30_000)
    nodes_c = clients.consumer(bootstrap_servers=cfg.bootstrap, group_id=None,
                               enable_auto_commit=False,
                               client_id=f"faultwatch-actuate-nodes-{uuid.uuid4().hex[:6]}")
    dec_c: Any = None
    await admin.start()
    await nodes_c.start()
    try:
        tp = TopicPartition(ntopic, 0)
        nodes_c.assign([tp])
        await nodes_c.seek_to_beginning(tp)
        end = (await nodes_c.end_offsets([tp]))[tp]

        async def pump_nodes(timeout_ms: int) -> None:
            batch = await nodes_c.getmany(timeout_ms=timeout_ms)
            for msgs in batch.values():
                for m in msgs:
                    if m.value is None:
                        continue
                    try:
                        rec = decode_node(m.value)
                    except DecodeError as e:
                        log_event("undecodable_record", topic=m.topic, partition=m.partition,
                                  offset=m.offset, error=str(e))
                        continue
                    act.on_node(rec, time.time())

        while await nodes_c.position(tp) < end:  # the registry as it is, before decisions
            await pump_nodes(cfg.poll_ms)
        log_event("actuate_started", backend=backend.name, nodes=len(act.registry),
                  group=cfg.group, state_file=str(cfg.state_file),
                  replaying=len(journal.pending))
        next_topic_check = 0.0
        while not stop.is_set():
            batch: dict[Any, list[Any]] = {}
            if dec_c is None and time.monotonic() >= next_topic_check:
                next_topic_check = time.monotonic() + 2.0
                if topics.decisions in set(await admin.list_topics()):
                    dec_c = clients.consumer(
                        topics.decisions, bootstrap_servers=cfg.bootstrap, group_id=cfg.group,
                        enable_auto_commit=False, auto_offset_reset="earliest",
                        client_id=f"faultwatch-actuate-{uuid.uuid4().hex[:6]}")
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
                    where = f"{m.topic}[{m.partition}]@{m.offset}"
                    if not gate.admit_record(m.value, topic=m.topic, partition=m.partition,
                                             offset=m.offset):
                        continue  # unsigned or forged while a key is configured: refused
                    try:
                        dec = decode_decision(m.value)
                    except DecodeError as e:
                        log_event("undecodable_record", topic=m.topic,
                                  partition=m.partition, offset=m.offset, error=str(e))
                        continue
                    ups.extend(act.on_decision(dec, time.time(), where))
            if ups:
                await write_records(cfg.bootstrap, ntopic, ups)
            now = time.time()
            act.tick(now)
            await asyncio.to_thread(act.run_due, now)
            if batch and dec_c is not None:
                await dec_c.commit()  # every action of these records is journaled
    finally:
        if dec_c is not None:
            await dec_c.stop()
        await nodes_c.stop()
        await admin.close()
        journal.close()
