"""The Faust shell: matcher agent (logs -> signals) and job agent (signals -> decisions)."""

from __future__ import annotations

import base64
import os
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import faust
import orjson

from faultwatch.core.events import Heartbeat, Output, Progress
from faultwatch.core.job import RUNNING, SETTLING, JobState
from faultwatch.core.matching import signals_of
from faultwatch.core.policy import Policy
from faultwatch.errors import DecodeError
from faultwatch.logs import log_event
from faultwatch.rules import RuleSet
from faultwatch.streams.rules_dist import attach_rules_watcher
from faultwatch.topics import DEFAULT_PARTITIONS, Topics
from faultwatch.wire import (
    SCHEMA_VERSION,
    decode,
    encode_decision,
    encode_signal,
    job_key,
    signal_of,
)

TICK_S = 0.5  # how often the settle timers of assigned partitions are advanced
REPORT_S = 10.0  # processor metrics interval
CAUGHT_UP_S = 2.0  # a tick older than this when processed: the partition is lagging
TICK_GAP_S = 4 * TICK_S + CAUGHT_UP_S  # no tick for this long: the clock was not watching
GRACE_S = 5.0  # extra grace (beyond node_lost_s) after assignment/recovery before node-lost
ACTIVE = (RUNNING, SETTLING)
LIVENESS = (Output, Heartbeat, Progress)


@dataclass
class ProcessorConfig:
    """Runtime knobs of `faultwatch process` (pipeline behaviour lives in rule files)."""

    bootstrap: str
    ruleset: RuleSet
    policy: Policy
    topics: Topics = field(default_factory=Topics)
    partitions: int = DEFAULT_PARTITIONS
    app_id: str = ""
    session_timeout_s: float = field(
        default_factory=lambda: float(os.environ.get("FAULTWATCH_SESSION_TIMEOUT_S", "10")))
    policy_overrides: dict[str, Any] = field(default_factory=dict)  # flags, kept on push

    @property
    def group(self) -> str:
        return self.app_id or f"{self.topics.prefix}processor"


@dataclass
class Metrics:
    """Counters of what this worker did, logged periodically."""

    records: int = 0
    lines: int = 0
    signals: int = 0
    decisions: int = 0
    dead_letters: int = 0
    jobs_signals: int = 0
    logs_event_lag_s: float = 0.0  # processor time - event time of the latest logs record
    tick_lag_s: dict[int, float] = field(default_factory=dict)
    extra: dict[str, int] = field(default_factory=dict)


@dataclass
class _Partition:
    """A signals partition this worker owns: cached job states, dirty and active keys."""

    since: float  # when this worker (re)started serving the partition, or caught up
    last_tick: float | None = None
    cache: dict[bytes, JobState] = field(default_factory=dict)
    dirty: set[bytes] = field(default_factory=set)
    active: set[bytes] = field(default_factory=set)


@dataclass
class _Live:
    """What a worker may swap while running (a new rule set pushed to the rules topic)."""

    policy: Policy
    rules_version: str


def build_app(cfg: ProcessorConfig) -> faust.App:
    """A Faust app with both stages; several workers with the same config share partitions."""
    app = faust.App(
        cfg.group,
        broker=f"kafka://{cfg.bootstrap}",
        store="memory://",
        topic_partitions=cfg.partitions,
        topic_replication_factor=1,
        key_serializer="raw",
        value_serializer="raw",
        web_enabled=False,
        consumer_auto_offset_reset="earliest",
        producer_acks=-1,
        broker_commit_interval=1.0,
        # a SIGKILLed worker's partitions move to the others after this long (Faust's 60 s
        # default would stall every takeover for a minute)
        broker_session_timeout=cfg.session_timeout_s,
        broker_heartbeat_interval=max(0.5, cfg.session_timeout_s / 6),
    )
    topics = cfg.topics
    logs_t = app.topic(topics.logs, key_type=bytes, value_type=bytes, partitions=cfg.partitions)
    signals_t = app.topic(topics.signals, key_type=bytes, value_type=bytes,
                          partitions=cfg.partitions)
    decisions_t = app.topic(topics.decisions, key_type=bytes, value_type=bytes)
    dead_t = app.topic(topics.deadletter, key_type=bytes, value_type=bytes)
    jobs = app.Table("jobs", default=None, partitions=cfg.partitions, key_type=bytes,
                     value_type=bytes)
    metrics = Metrics()
    live = _Live(policy=cfg.policy, rules_version=cfg.ruleset.version)
    matcher = attach_rules_watcher(app, cfg, live)  # swaps rule sets pushed to the rules topic

    async def dead_letter(event: Any, err: Exception) -> None:
        msg = event.message
        metrics.dead_letters += 1
        log_event("dead_letter", topic=msg.topic, partition=msg.partition, offset=msg.offset,
                  error=str(err))
        raw = event.value if isinstance(event.value, bytes) else b""
        await dead_t.send(key=event.key, value=orjson.dumps({
            "v": SCHEMA_VERSION, "topic": msg.topic, "partition": msg.partition,
            "offset": msg.offset, "error": str(err),
            "value_b64": base64.b64encode(raw[:1_000_000]).decode()}))

    @app.agent(logs_t)
    async def match(stream: faust.StreamT) -> AsyncIterator[None]:
        async for event in stream.events():
            metrics.records += 1
            try:
                rec = decode(event.value)
                if rec.get("t") == "lines" and rec.get("lines"):
                    metrics.lines += len(rec["lines"])
                    metrics.logs_event_lag_s = time.time() - float(rec["lines"][-1][2])
                sigs = signals_of(rec, matcher)
            except (DecodeError, KeyError, TypeError, ValueError) as e:
                await dead_letter(event, e)
                continue
            for s in sigs:
                metrics.signals += 1
                await signals_t.send(key=job_key(s.job), value=encode_signal(s))
            yield None

    async def publish(decs: list[Any]) -> None:
        for d in decs:
            metrics.decisions += 1
            metrics.extra[f"decisions.{d.kind}"] = metrics.extra.get(f"decisions.{d.kind}", 0) + 1
            log_event("decision", id=d.id, job=d.job, attempt=d.attempt, action=d.action,
                      kind=d.kind, rule=d.rule)
            await decisions_t.send(key=job_key(d.job), value=encode_decision(d))

    # Live job states of this worker's partitions: the table (with its changelog) is the
    # durable copy. Lifecycle signals and decisions write through; liveness signals
    # (output, heartbeats, progress) of big jobs arrive constantly, so they only mark the
    # job dirty and the partition's next tick (every TICK_S) writes it once. A crash loses
    # at most that much liveness, which later records restore. Rebuilt on (re)assignment.
    parts: dict[int, _Partition] = {}

    def part(partition: int) -> _Partition:
        p = parts.get(partition)
        if p is None:
            p = parts[partition] = _Partition(since=time.time())
            for k, raw in list(jobs.items()):
                if raw is None:
                    continue
                d = orjson.loads(raw)
                if d.get("_p") == partition and d.get("phase") in ACTIVE:
                    p.active.add(k)
        return p

    def load(key: bytes, p: _Partition) -> JobState | None:
        st = p.cache.get(key)
        if st is not None:
            return st
        raw = jobs.get(key)
        if raw is None:
            return None
        st = JobState.from_dict(orjson.loads(raw))
        p.cache[key] = st
        return st

    def write(key: bytes, st: JobState, partition: int) -> None:
        d = st.to_dict()
        d["_p"] = partition
        jobs[key] = orjson.dumps(d)
        metrics.extra["table_writes"] = metrics.extra.get("table_writes", 0) + 1

    def save(key: bytes, st: JobState, partition: int, p: _Partition, durable: bool) -> None:
        p.cache[key] = st
        (p.active.add if st.phase in ACTIVE else p.active.discard)(key)
        if durable:
            write(key, st, partition)
            p.dirty.discard(key)
        else:
            p.dirty.add(key)

    @app.agent(signals_t)
    async def decide(stream: faust.StreamT) -> AsyncIterator[None]:
        async for event in stream.events():
            partition = event.message.partition
            try:
                d = decode(event.value)
                if d["t"] == "tick":
                    await tick_partition(partition, float(d["now"]))
                    continue
                sig = signal_of(d)
            except (DecodeError, KeyError, TypeError, ValueError) as e:
                await dead_letter(event, e)
                continue
            metrics.jobs_signals += 1
            p = part(partition)
            key = job_key(sig.job)
            old = load(key, p) or JobState(job=sig.job)
            st, decs = old.apply(sig, time.time(), live.policy, live.rules_version)
            if st is not old:
                durable = bool(decs) or st.phase != old.phase or st.attempt != old.attempt \
                    or not isinstance(sig, LIVENESS)
                save(key, st, partition, p, durable)
            await publish(decs)
            yield None

    async def tick_partition(partition: int, sent: float) -> None:
        p = part(partition)
        now = time.time()
        lag = max(0.0, now - sent)
        metrics.tick_lag_s[partition] = round(lag, 3)
        for key in list(p.dirty):
            st = p.cache.get(key)
            if st is not None:
                write(key, st, partition)
        p.dirty.clear()
        # processor time is trusted for node-lost only when this partition is caught up
        # (the tick came through the topic quickly) and every node had a full window to
        # show itself since the partition was assigned or recovered
        # A lagging partition, or one that went without ticks (broker outage, a stalled
        # loop), restarts the grace: its backlog of heartbeats is still on the way.
        if lag >= CAUGHT_UP_S or (p.last_tick is not None and now - p.last_tick > TICK_GAP_S):
            p.since = now
        p.last_tick = now
        live_clock = now - p.since >= live.policy.node_lost_s + GRACE_S
        for key in list(p.active):
            st = load(key, p)
            if st is None:
                p.active.discard(key)
                continue
            st2, decs = st.tick(now, live.policy, live.rules_version, live_clock=live_clock)
            if st2 is not st:
                save(key, st2, partition, p, True)
            elif st.phase not in ACTIVE:
                p.active.discard(key)
            await publish(decs)

    @app.on_partitions_revoked.connect  # type: ignore[arg-type]
    async def on_revoked(sender: Any, *args: Any, signal: Any = None, **kwargs: Any) -> None:
        parts.clear()

    @app.on_partitions_assigned.connect  # type: ignore[arg-type]
    async def on_assigned(sender: Any, *args: Any, signal: Any = None, **kwargs: Any) -> None:
        parts.clear()  # rebuilt (grace restarts) after recovery, on the first record

    @app.timer(interval=TICK_S)
    async def ticker() -> None:
        # Timers fire on every worker and during rebalances: only tick partitions this
        # worker actively owns, and not while rebalancing or recovering tables.
        if app.rebalancing or getattr(app, "in_recovery", False):
            return
        now = time.time()
        for tp in app.assignor.assigned_actives():
            if tp.topic == topics.signals:
                await signals_t.send(key=None, partition=tp.partition,
                                     value=orjson.dumps({"v": SCHEMA_VERSION, "t": "tick",
                                                         "now": now}))

    last_report = [time.time(), 0, 0, 0]

    @app.timer(interval=REPORT_S)
    async def report() -> None:
        now = time.time()
        dt = max(1e-6, now - last_report[0])
        rates = {"records_per_s": round((metrics.records - last_report[1]) / dt, 1),
                 "lines_per_s": round((metrics.lines - last_report[2]) / dt, 1),
                 "signals_per_s": round((metrics.jobs_signals - last_report[3]) / dt, 1)}
        last_report[:] = [now, metrics.records, metrics.lines, metrics.jobs_signals]
        lag: dict[str, int] = {}
        try:
            for tp in app.assignor.assigned_actives():
                if tp.topic in (topics.logs, topics.signals):
                    pos = await app.consumer.position(tp)
                    hw = app.consumer.highwater(tp)
                    if pos is not None and hw is not None:
                        lag[f"{tp.topic.rsplit('.', 1)[-1]}/{tp.partition}"] = max(0, hw - pos)
        except Exception:  # noqa: BLE001 - metrics must never stop the worker
            pass
        log_event("processor_metrics", records=metrics.records, lines=metrics.lines,
                  signals=metrics.signals, job_signals=metrics.jobs_signals,
                  decisions=metrics.decisions, dead_letters=metrics.dead_letters,
                  consumer_lag=lag, tick_lag_s=dict(metrics.tick_lag_s),
                  logs_event_lag_s=round(metrics.logs_event_lag_s, 3),
                  jobs_cached=sum(len(p.cache) for p in parts.values()),
                  jobs_active=sum(len(p.active) for p in parts.values()),
                  rates=rates, counters=dict(metrics.extra))

    return app
