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
from faultwatch.actuate.confirm import confirm
from faultwatch.actuate.journal import Journal
from faultwatch.actuate.limits import ActuateLimits, DrainLimiter
from faultwatch.actuate.plan import QUARANTINE, RELEASE, REQUEUE, Action, plan_decision, plan_node
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
from faultwatch.trust.intake import DecisionIntake, fresh, where_of
from faultwatch.trust.refusals import REFUSALS
from faultwatch.trust.replay import DEFAULT_MAX_AGE_S, REPLAYED, ReplayGuard, superseded
from faultwatch.wire import decode_node


@dataclass(frozen=True)
class ActuateConfig:
    bootstrap: str
    prefix: str
    state_file: Path
    group: str
    write_registry: bool = False  # also derive registry updates (the job stage writes them)
    max_decision_age_s: float = DEFAULT_MAX_AGE_S
    poll_ms: int = 500
    retry_s: float = 5.0
    max_tries: int = 5
    registry_policy: RegistryPolicy = RegistryPolicy()
    limits: ActuateLimits = ActuateLimits()
    fleet_nodes: int = 0  # the fleet's size when the registry knows fewer (healthy nodes
    #                       that never had a record are not on it)
    hold_summary_s: float = 300.0  # while holding: one line this often with the count


def hold_file(state_file: Path) -> Path:
    """Written while drains are held: which nodes, why, how to release."""
    return state_file.with_name(state_file.name + ".hold")


def release_file(state_file: Path) -> Path:
    """Created by `faultwatch actuate --release-hold`: the running actuator releases the hold."""
    return state_file.with_name(state_file.name + ".release")


class Actuator:
    """The pure-ish middle: decisions and node records in, actions (journaled) out."""

    def __init__(self, backend: Backend, journal: Journal, cfg: ActuateConfig,
                 replay: ReplayGuard | None = None) -> None:
        self.backend, self.journal, self.cfg = backend, journal, cfg
        # the replay rule: a decision acts once (across restarts: beside the journal) and
        # only within the maximum age
        self.replay = replay or ReplayGuard("decision", cfg.max_decision_age_s, log=log_event)
        self.registry: Registry = {}
        self.queue: deque[tuple[Action, int, float]] = deque()  # action, tries, not before
        self.queued: set[str] = set()
        self.limiter = DrainLimiter(cfg.limits)
        self.held: dict[str, Action] = {}  # key -> action held by the limits, in order
        self.held_since: float | None = None
        self.held_why = ""
        self._next_hold_summary = 0.0
        self._unlimited: set[str] = set()  # keys an operator released from a hold
        # what was done, for the acted topic (reports show it on the incident's timeline)
        self.acted: deque[tuple[Action, str, float]] = deque(maxlen=10_000)
        self.acted_failing = False
        self._refused: dict[str, str] = {}  # node -> the error last logged for it
        # keys refused for want of a scheduler identity (a processor's registry record of a
        # blacklist names the job, not its Slurm id or pod): the blacklist decision itself,
        # read after it, carries the identity and is confirmed afresh
        self._unidentified: set[str] = set()
        for a in journal.pending.values():  # begun before a crash: replay
            log_event("actuate_replay", key=a.key)
            self._enqueue(a, replay=True)

    def _enqueue(self, a: Action, replay: bool = False) -> None:
        if a.key in self.queued:
            if a.scheduler:  # the same action, now with the scheduler identity to confirm it
                for i, (q, tries, not_before) in enumerate(self.queue):
                    if q.key == a.key and not q.scheduler:
                        self.queue[i] = (a, tries, not_before)
            return
        if not replay and self.journal.is_done(a.key) and not (
                a.scheduler and a.key in self._unidentified):
            return
        self._unidentified.discard(a.key)
        self.queued.add(a.key)
        self.queue.append((a, 0, 0.0))

    def take_decision(self, value: bytes | None, now: float, gate: Any, *, topic: str,
                      partition: int, offset: int) -> list[NodeRecord]:
        """One decisions-topic record: signature (gate), decode, the replay rule, plan."""
        dec = DecisionIntake(gate, self.replay, log_event).decode(
            value, topic=topic, partition=partition, offset=offset)
        return [] if dec is None else self.on_decision(dec, now, where_of(topic, partition,
                                                                          offset))

    def take_node(self, value: bytes | None, now: float, gate: Any, *, topic: str,
                  partition: int, offset: int) -> None:
        """One nodes-topic record: signature (gate; tombstones are refused with a trust
        file, ignored without), decode, plan."""
        if not gate.admit_value(value, topic=topic, partition=partition, offset=offset):
            return
        if value is None:
            return
        try:
            rec = decode_node(value)
        except DecodeError as e:
            log_event("undecodable_record", topic=topic, partition=partition, offset=offset,
                      error=str(e))
            return
        held = self.registry.get(rec.node)
        if getattr(gate, "verifying", False) and held is not None and superseded(
                held.updated_ts, rec.updated_ts):
            gate.refuse(REPLAYED, f"node {rec.node!r}: a record of {rec.updated_ts:.0f} after "
                        f"one of {held.updated_ts:.0f} (an old record written again)",
                        topic=topic, partition=partition, offset=offset)
            return
        self.on_node(rec, now)

    def on_decision(self, dec: Decision, now: float, where: str) -> list[NodeRecord]:
        """Plan a decision's actions; return the registry records it changes (to publish)."""
        if not fresh(self.replay, dec, now, log_event, where, where=where):
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
            if self._refused.get(rec.node) != str(e):  # once per entry and error, not per tick
                self._refused[rec.node] = str(e)
                log_event("actuate_node_rejected", node=rec.node[:80], error=str(e))
            return
        self._refused.pop(rec.node, None)

    def seed_drained(self, now: float) -> None:
        """After the registry is read: the nodes faultwatch drained before a restart count
        toward the limits (their quarantine is done in the journal)."""
        for rec in self.registry.values():
            try:
                acts = plan_node(rec, now)
            except ConfigError:
                continue
            if any(a.kind == QUARANTINE and self.journal.is_done(a.key) for a in acts):
                self.limiter.drained(rec.node, now)

    def _hold(self, a: Action, why: str, now: float) -> None:
        first = not self.held
        self.held[a.key] = a
        self.queued.discard(a.key)
        if first:
            self.held_since, self.held_why = now, why
            self._next_hold_summary = now + self.cfg.hold_summary_s
            log_event("actuate_hold", backend=self.backend.name, why=why,
                      nodes=",".join(self.held_nodes())[:500],
                      release=self._release_cmd())
        self._write_hold()

    def _release_cmd(self) -> str:
        return (f"faultwatch actuate --backend {self.backend.name} --state-file "
                f"{self.cfg.state_file} --release-hold")

    def held_nodes(self) -> list[str]:
        return list(dict.fromkeys(a.node for a in self.held.values() if a.kind == QUARANTINE))

    def _write_hold(self) -> None:
        import orjson

        path = hold_file(self.cfg.state_file)
        tmp = path.with_name(path.name + ".tmp")
        tmp.write_bytes(orjson.dumps({
            "since": self.held_since, "why": self.held_why, "nodes": self.held_nodes(),
            "actions": len(self.held),
            "release": self._release_cmd()},
            option=orjson.OPT_INDENT_2))
        tmp.replace(path)

    def check_release(self, now: float) -> int:
        """An operator asked to release the hold: the held actions run (beyond the limits),
        counting starts afresh. Returns how many actions were released."""
        rel = release_file(self.cfg.state_file)
        if not rel.exists():
            if self.held and now >= self._next_hold_summary:
                self._next_hold_summary = now + self.cfg.hold_summary_s
                log_event("actuate_holding", nodes=len(self.held_nodes()),
                          actions=len(self.held), since_s=round(now - (self.held_since or now)),
                          release=self._release_cmd())
            return 0
        held = list(self.held.values())
        log_event("actuate_hold_released", nodes=len(self.held_nodes()), actions=len(held))
        self.held.clear()
        self.held_since = None
        self.limiter.reset()
        for a in held:
            self._unlimited.add(a.key)
            self._enqueue(a)
        for f in (rel, hold_file(self.cfg.state_file)):
            f.unlink(missing_ok=True)
        return len(held)

    def _limit(self, a: Action, now: float) -> str | None:
        """Why this action must wait (the drain limits), or None."""
        if a.key in self._unlimited:
            return None
        if a.kind == REQUEUE and any(h.node == a.node and h.kind == QUARANTINE
                                     for h in self.held.values()):
            return "its node's drain is held"
        if a.kind != QUARANTINE:
            return None
        if self.held:
            return self.held_why  # one hold: later drains wait behind the first held one
        known = max(self.cfg.fleet_nodes, len(self.registry.keys() | {a.node}))
        return self.limiter.why_not(a.node, known, now)

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
            why = self._limit(a, now)
            if why is not None:
                self._hold(a, why, now)
                continue
            if a.key not in self.journal.pending:
                self.journal.begin(a)
            try:
                refusal = confirm(self.backend, a)
                if refusal is not None:
                    if not a.scheduler:
                        self._unidentified.add(a.key)
                    REFUSALS[("actuate", "not_allocated")] += 1
                    log_event("actuate_refused", reason="not_allocated", backend=self.backend.name,
                              kind=a.kind, node=a.node, decision=a.decision, job=a.job,
                              detail=refusal)
                    self.journal.done(a, f"refused: {refusal}")
                    self.queued.discard(a.key)
                    continue
                result = self.backend.apply(a)
            except (ActuateError, FaultwatchError) as e:
                tries += 1
                if getattr(e, "permanent", False):
                    log_event("actuate_failed", backend=self.backend.name, kind=a.kind,
                              node=a.node, decision=a.decision, tries=tries,
                              cause=str(e), retry="no (a permanent error)")
                    self.journal.done(a, f"failed: {e}")
                    self.queued.discard(a.key)
                    self._unlimited.discard(a.key)
                    continue
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
            self._unlimited.discard(a.key)
            if a.kind == QUARANTINE:
                self.limiter.drained(a.node, now)
            elif a.kind == RELEASE:
                self.limiter.resumed(a.node)
            ran += 1
            self.acted.append((a, str(result), time.time()))
            log_event("actuated", backend=self.backend.name, kind=a.kind, node=a.node,
                      decision=a.decision, rule=a.rule, job=a.job, result=result)
        return ran


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
    from faultwatch.kafka.admin import ensure_compacted_topic
    from faultwatch.nodes.store import write_records
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
    await ensure_compacted_topic(cfg.bootstrap, ntopic)
    journal = Journal(cfg.state_file)
    seen = cfg.state_file.with_name(cfg.state_file.name + ".seen")
    act = Actuator(backend, journal, cfg,
                   ReplayGuard("decision", cfg.max_decision_age_s, seen, log_event))
    calm = broker_calm.install()  # aiokafka's per-retry errors: one line per state change
    backoff = broker_calm.client_backoff()  # ... and retries at most once a second
    admin = clients.admin(bootstrap_servers=cfg.bootstrap, request_timeout_ms=30_000,
                          **backoff)
    nodes_c = clients.consumer(bootstrap_servers=cfg.bootstrap, group_id=None,
                               enable_auto_commit=False,
                               client_id=f"faultwatch-actuate-nodes-{uuid.uuid4().hex[:6]}",
                               **backoff)
    dec_c: Any = None
    producer = clients.producer(bootstrap_servers=cfg.bootstrap, acks="all", **backoff)
    await admin.start()
    await nodes_c.start()
    await producer.start()
    try:
        tp = TopicPartition(ntopic, 0)
        nodes_c.assign([tp])
        await nodes_c.seek_to_beginning(tp)
        end = (await nodes_c.end_offsets([tp]))[tp]

        async def pump_nodes(timeout_ms: int) -> None:
            batch = await nodes_c.getmany(timeout_ms=timeout_ms)
            for msgs in batch.values():
                for m in msgs:
                    act.take_node(m.value, time.time(), node_gate, topic=m.topic,
                                  partition=m.partition, offset=m.offset)

        while await nodes_c.position(tp) < end:  # the registry as it is, before decisions
            await pump_nodes(cfg.poll_ms)
        act.seed_drained(time.time())
        log_event("actuate_started", backend=backend.name, nodes=len(act.registry),
                  group=cfg.group, state_file=str(cfg.state_file),
                  replaying=len(journal.pending))
        next_topic_check = polled = 0.0
        while not stop.is_set():
            batch: dict[Any, list[Any]] = {}
            if dec_c is None and time.monotonic() >= next_topic_check:
                next_topic_check = time.monotonic() + 2.0
                if topics.decisions in set(await admin.list_topics()):
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
        if dec_c is not None:
            await dec_c.stop()
        await nodes_c.stop()
        await producer.stop()
        await admin.close()
        journal.close()
