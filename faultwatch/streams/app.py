"""The Faust shell: matcher agent (logs -> signals) and job agent (signals -> decisions)."""

from __future__ import annotations

import base64
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import faust
import orjson

from faultwatch.core.job import SETTLING, JobState
from faultwatch.core.matching import signals_of
from faultwatch.core.policy import Policy
from faultwatch.errors import DecodeError
from faultwatch.logs import log_event
from faultwatch.rules import Matcher, RuleSet
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


@dataclass
class ProcessorConfig:
    """Runtime knobs of `faultwatch process` (pipeline behaviour lives in rule files)."""

    bootstrap: str
    ruleset: RuleSet
    policy: Policy
    topics: Topics = field(default_factory=Topics)
    partitions: int = DEFAULT_PARTITIONS
    app_id: str = ""

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
    extra: dict[str, int] = field(default_factory=dict)


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
    )
    topics = cfg.topics
    logs_t = app.topic(topics.logs, key_type=bytes, value_type=bytes, partitions=cfg.partitions)
    signals_t = app.topic(topics.signals, key_type=bytes, value_type=bytes,
                          partitions=cfg.partitions)
    decisions_t = app.topic(topics.decisions, key_type=bytes, value_type=bytes)
    dead_t = app.topic(topics.deadletter, key_type=bytes, value_type=bytes)
    jobs = app.Table("jobs", default=None, partitions=cfg.partitions, key_type=bytes,
                     value_type=bytes)
    matcher = Matcher(cfg.ruleset)
    metrics = Metrics()
    live = _Live(policy=cfg.policy, rules_version=cfg.ruleset.version)

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
                sigs = signals_of(decode(event.value), matcher)
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
            log_event("decision", id=d.id, job=d.job, attempt=d.attempt, action=d.action,
                      kind=d.kind, rule=d.rule)
            await decisions_t.send(key=job_key(d.job), value=encode_decision(d))

    def load(key: bytes) -> JobState | None:
        raw = jobs.get(key)
        return None if raw is None else JobState.from_dict(orjson.loads(raw))

    # Jobs waiting out their settle time, per partition, so ticks touch only those. Rebuilt
    # from the table on the first tick of a partition (after start, rebalance or recovery).
    settling: dict[int, set[bytes]] = {}

    def save(key: bytes, st: JobState, partition: int) -> None:
        d = st.to_dict()
        d["_p"] = partition
        jobs[key] = orjson.dumps(d)
        waiting = settling.get(partition)
        if waiting is not None:
            (waiting.add if st.phase == SETTLING else waiting.discard)(key)

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
            key = job_key(sig.job)
            st = load(key) or JobState(job=sig.job)
            st, decs = st.apply(sig, time.time(), live.policy, live.rules_version)
            save(key, st, partition)
            await publish(decs)
            yield None

    async def tick_partition(partition: int, now: float) -> None:
        if partition not in settling:
            settling[partition] = {
                k for k, raw in list(jobs.items()) if raw is not None
                and (d := orjson.loads(raw)).get("_p") == partition
                and d.get("phase") == SETTLING}
        for key in list(settling[partition]):
            st = load(key)
            if st is None:
                settling[partition].discard(key)
                continue
            st2, decs = st.tick(now, live.policy, live.rules_version)
            if st2 is not st:
                save(key, st2, partition)
            await publish(decs)

    @app.on_partitions_revoked.connect  # type: ignore[arg-type]
    async def on_revoked(sender: Any, *args: Any, signal: Any = None, **kwargs: Any) -> None:
        settling.clear()

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

    @app.timer(interval=30.0)
    async def report() -> None:
        log_event("processor_metrics", records=metrics.records, signals=metrics.signals,
                  decisions=metrics.decisions, dead_letters=metrics.dead_letters)

    return app
