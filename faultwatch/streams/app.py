"""The Faust shell: matcher agent (logs -> signals) and job agent (signals -> decisions)."""

from __future__ import annotations

import asyncio
import base64
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import faust
import orjson

from faultwatch.core.events import Heartbeat, Output, Progress
from faultwatch.core.job import JobState, Phase, apply, new_state, tick
from faultwatch.core.policy import Policy
from faultwatch.errors import DecodeError
from faultwatch.logs import log_event
from faultwatch.matching import signals_of_record as signals_of_logs_record
from faultwatch.rules import RuleSet
from faultwatch.streams.faust_compat import set_current_event
from faultwatch.streams.rules_dist import attach_rules_watcher
from faultwatch.streams.stopping import StopGate
from faultwatch.topics import DEFAULT_PARTITIONS, Topics
from faultwatch.wire import (
    SCHEMA_VERSION,
    LinesBatch,
    Tick,
    decode_logs,
    decode_signals,
    encode_bundle,
    encode_decision,
    encode_tick,
    job_key,
    signal_dict,
)

TICK_S = 0.5  # how often the settle timers of assigned partitions are advanced
REPORT_S = 10.0  # processor metrics interval
CAUGHT_UP_S = 2.0  # a tick older than this when processed: the partition is lagging
TICK_GAP_S = 4 * TICK_S + CAUGHT_UP_S  # no tick for this long: the clock was not watching
GRACE_S = 5.0  # extra grace (beyond node_lost_s) after assignment/recovery before node-lost
ACTIVE = (Phase.RUNNING, Phase.SETTLING)
LIVENESS = (Output, Heartbeat, Progress)
BATCH = 1000  # records per take_events() batch, both stages
BATCH_WITHIN_S = 0.05  # ... or whatever arrived within this long
WRITE_BEHIND_S = 5.0  # a job whose only changes are liveness is written at most this often


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
    written: dict[bytes, float] = field(default_factory=dict)  # last table write (processor)


@dataclass
class _Live:
    """What a worker may swap while running (a new rule set pushed to the rules topic)."""

    policy: Policy
    rules_version: str


def _data_root() -> Path:
    """Where Faust keeps its per-app metadata: $FAULTWATCH_PROCESSOR_DIR or the user cache."""
    env = os.environ.get("FAULTWATCH_PROCESSOR_DIR")
    root = Path(env) if env else Path.home() / ".cache" / "faultwatch" / "processor"
    root.mkdir(parents=True, exist_ok=True)  # Faust creates only the last path component
    return root


@dataclass
class Processor:
    """A worker's Faust app and what its bounded stop needs: the gate both stages' batches
    pass, and a function writing the job states only cached so far (write-behind)."""

    app: faust.App
    gate: StopGate
    flush_states: Any  # () -> int: states written
    dirty_states: Any  # () -> int: states not yet written


def build_app(cfg: ProcessorConfig) -> faust.App:
    """A Faust app with both stages; several workers with the same config share partitions."""
    return build_processor(cfg).app


def build_processor(cfg: ProcessorConfig) -> Processor:
    """The Faust app with both stages and its stop hooks (see Processor)."""
    app = faust.App(
        cfg.group,
        broker=f"kafka://{cfg.bootstrap}",
        store="memory://",
        # Faust's own metadata dir; state lives in the changelog topics (memory store)
        datadir=str(_data_root() / cfg.group),
        topic_partitions=cfg.partitions,
        topic_replication_factor=1,
        key_serializer="raw",
        value_serializer="raw",
        web_enabled=False,
        consumer_auto_offset_reset="earliest",
        producer_acks=-1,
        broker_commit_interval=1.0,
        # bigger fetches and stream buffers: the agents batch lines, records are 1-15 kB
        consumer_max_fetch_size=8 << 20,
        stream_buffer_maxsize=16384,
        producer_linger_ms=5,
        producer_max_batch_size=1 << 20,
        # a SIGKILLed worker's partitions move to the others after this long (Faust's 60 s
        # default would stall every takeover for a minute)
        broker_session_timeout=cfg.session_timeout_s,
        broker_heartbeat_interval=max(0.5, cfg.session_timeout_s / 6),
        # our stop waits for the gate, not for every fetched event to be acknowledged
        stream_wait_empty=False,
    )
    gate = StopGate()
    topics = cfg.topics
    logs_t = app.topic(topics.logs, key_type=bytes, value_type=bytes, partitions=cfg.partitions)
    signals_t = app.topic(topics.signals, key_type=bytes, value_type=bytes,
                          partitions=cfg.partitions)
    decisions_t = app.topic(topics.decisions, key_type=bytes, value_type=bytes)
    dead_t = app.topic(topics.deadletter, key_type=bytes, value_type=bytes)
    jobs = app.Table("jobs", default=None, partitions=cfg.partitions, key_type=bytes,
                     value_type=bytes)
    metrics = Metrics()
    # event-time lag of the latest record per logs partition, and whether this worker's
    # logs partitions are caught up (for the settle fallback: a root line may sit there)
    logs_lag: dict[int, float] = {}
    logs_caught_up = [True]
    live = _Live(policy=cfg.policy, rules_version=cfg.ruleset.version)
    matcher = attach_rules_watcher(app, cfg, live)  # swaps rule sets pushed to the rules topic

    async def dead_letter(event: Any, err: Exception) -> None:
        msg = event.message
        metrics.dead_letters += 1
        err_text = str(err) if isinstance(err, DecodeError) else f"{type(err).__name__}: {err}"
        log_event("dead_letter", topic=msg.topic, partition=msg.partition, offset=msg.offset,
                  error=err_text)
        raw = event.value if isinstance(event.value, bytes) else b""
        await dead_t.send(key=event.key, force=True, value=orjson.dumps({
            "v": SCHEMA_VERSION, "topic": msg.topic, "partition": msg.partition,
            "offset": msg.offset, "error": err_text,
            "value_b64": base64.b64encode(raw[:1_000_000]).decode()}))

    @app.agent(logs_t)
    async def match(stream: faust.StreamT) -> None:
        # Batches: all signals one batch implies for a job go out as ONE signals record (a
        # bundle), in the order of the logs records, so each node's lines still precede its
        # exit and its later heartbeats on the signals topic (core/failure.py relies on it).
        async for events in stream.take_events(  # type: ignore[attr-defined]
                BATCH, within=BATCH_WITHIN_S):
            async with gate.batch():
                await match_batch(events)

    async def match_batch(events: list[Any]) -> None:
        if True:
            out: dict[str, list[dict[str, Any]]] = {}
            for event in events:
                metrics.records += 1
                try:
                    rec = decode_logs(event.value)
                    if isinstance(rec, LinesBatch) and rec.lines:
                        metrics.lines += len(rec.lines)
                        metrics.logs_event_lag_s = time.time() - rec.lines[-1].ts
                        logs_lag[event.message.partition] = metrics.logs_event_lag_s
                    elif isinstance(rec, Heartbeat):
                        logs_lag[event.message.partition] = time.time() - rec.ts
                    sigs = signals_of_logs_record(rec, matcher)
                    dicts = [signal_dict(x) for x in sigs]
                except Exception as e:  # noqa: BLE001 - one bad record never stops the worker
                    await dead_letter(event, e)
                    continue
                for sig, d in zip(sigs, dicts, strict=True):
                    out.setdefault(sig.job, []).append(d)
            # sent at once (force: not held back until the source offsets are committed),
            # then awaited together: the batch is acked (committable) only once delivered
            futs = []
            for job, ds in out.items():
                metrics.signals += len(ds)
                futs.append(await signals_t.send(key=job_key(job), value=encode_bundle(job, ds),
                                                 force=True))
            if futs:
                await asyncio.gather(*futs)

    pending: list[Any] = []  # decision deliveries of the current job-stage batch

    async def publish(decs: list[Any]) -> None:
        for d in decs:
            metrics.decisions += 1
            metrics.extra[f"decisions.{d.kind}"] = metrics.extra.get(f"decisions.{d.kind}", 0) + 1
            log_event("decision", id=d.id, job=d.job, attempt=d.attempt, action=d.action,
                      kind=d.kind, rule=d.rule)
            pending.append(await decisions_t.send(key=job_key(d.job),
                                                  value=encode_decision(d), force=True))

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

    def write(key: bytes, st: JobState, partition: int, p: _Partition) -> None:
        d = st.to_dict()
        d["_p"] = partition
        raw = orjson.dumps(d)
        jobs[key] = raw
        p.written[key] = time.time()
        metrics.extra["table_writes"] = metrics.extra.get("table_writes", 0) + 1
        metrics.extra["table_bytes"] = metrics.extra.get("table_bytes", 0) + len(raw)

    def save(key: bytes, st: JobState, partition: int, p: _Partition, durable: bool) -> None:
        p.cache[key] = st
        (p.active.add if st.phase in ACTIVE else p.active.discard)(key)
        if durable:
            write(key, st, partition, p)
            p.dirty.discard(key)
        else:
            p.dirty.add(key)

    @app.agent(signals_t)
    async def decide(stream: faust.StreamT) -> None:
        async for events in stream.take_events(  # type: ignore[attr-defined]
                BATCH, within=BATCH_WITHIN_S):
            async with gate.batch():
                await decide_batch(events)

    async def decide_batch(events: list[Any]) -> None:
        if True:
            for event in events:
                partition = event.message.partition
                set_current_event(event)
                try:
                    sigs = decode_signals(event.value)
                    if isinstance(sigs, Tick):
                        await tick_partition(partition, sigs.now)
                        continue
                    if sigs:
                        await fold(partition, sigs)
                except Exception as e:  # noqa: BLE001 - one bad record never stops the worker
                    await dead_letter(event, e)
                    continue
            if pending:  # decisions delivered before the batch is acked (at least once)
                futs = pending[:]
                pending.clear()
                await asyncio.gather(*futs)

    async def fold(partition: int, sigs: list[Any]) -> None:
        """Apply one record's signals (one job: a bundle is keyed by its job) in order."""
        p = part(partition)
        now = time.time()
        metrics.jobs_signals += len(sigs)
        key = b""
        st: JobState | None = None
        old: JobState | None = None
        durable = False
        for sig in sigs:
            k = job_key(sig.job)
            if k != key:  # a bundle holds one job; a hand-made one might not
                if st is not None and st is not old:
                    save(key, st, partition, p, durable)
                key, durable = k, False
                old = st = load(key, p)
            if st is None:  # only a run-start starts a job's state (no phantom jobs)
                st = new_state(sig)
                if st is None:
                    metrics.extra["dropped.no-run"] = metrics.extra.get("dropped.no-run", 0) + 1
                    continue
                old = None
            prev = st
            st, decs = apply(st, sig, now, live.policy, live.rules_version)
            if st is not prev:
                durable = durable or bool(decs) or st.phase != prev.phase \
                    or st.attempt != prev.attempt or not isinstance(sig, LIVENESS)
            if decs:
                await publish(decs)
        if st is not None and st is not old:
            save(key, st, partition, p, durable)

    async def tick_partition(partition: int, sent: float) -> None:
        p = part(partition)
        now = time.time()
        lag = max(0.0, now - sent)
        metrics.tick_lag_s[partition] = round(lag, 3)
        # liveness-only changes are written behind, at most every WRITE_BEHIND_S per job
        # (a crash loses at most that much liveness, which the next records restore)
        for key in list(p.dirty):
            if now - p.written.get(key, 0.0) < WRITE_BEHIND_S:
                continue
            st = p.cache.get(key)
            if st is not None:
                write(key, st, partition, p)
            p.dirty.discard(key)
        # processor time is trusted for node-lost only when this partition is caught up
        # (the tick came through the topic quickly) and every node had a full window to
        # show itself since the partition was assigned or recovered
        # A lagging partition, or one that went without ticks (broker outage, a stalled
        # loop), restarts the grace: its backlog of heartbeats is still on the way.
        if lag >= CAUGHT_UP_S or (p.last_tick is not None and now - p.last_tick > TICK_GAP_S):
            p.since = now
        p.last_tick = now
        live_clock = now - p.since >= live.policy.node_lost_s + GRACE_S
        caught_up = lag < CAUGHT_UP_S and logs_caught_up[0]
        for key in list(p.active):
            st = load(key, p)
            if st is None:
                p.active.discard(key)
                continue
            st2, decs = tick(st, now, live.policy, live.rules_version, live_clock=live_clock,
                                caught_up=caught_up)
            if st2 is not st:
                save(key, st2, partition, p, True)
            elif st.phase not in ACTIVE:
                p.active.discard(key)
            await publish(decs)

    def flush_states() -> int:
        """Write every dirty (write-behind) state now; no current event is needed."""
        n = 0
        for partition, p in list(parts.items()):
            for key in list(p.dirty):
                st = p.cache.get(key)
                if st is not None:
                    d = st.to_dict()
                    d["_p"] = partition
                    jobs.send_changelog(partition, key, orjson.dumps(d))
                    n += 1
                p.dirty.discard(key)
        return n

    def dirty_states() -> int:
        return sum(len(p.dirty) for p in parts.values())

    def _tps(args: tuple[Any, ...]) -> str:
        tps = args[0] if args else ()
        return ",".join(sorted(f"{tp.topic.rsplit('.', 1)[-1]}/{tp.partition}" for tp in tps
                               if tp.topic in (topics.logs, topics.signals))) or "-"

    @app.on_partitions_revoked.connect  # type: ignore[arg-type]
    async def on_revoked(sender: Any, *args: Any, signal: Any = None, **kwargs: Any) -> None:
        written = flush_states()  # the write-behind states go with the partitions
        log_event("partitions_revoked", partitions=_tps(args), states_written=written)
        parts.clear()

    @app.on_partitions_assigned.connect  # type: ignore[arg-type]
    async def on_assigned(sender: Any, *args: Any, signal: Any = None, **kwargs: Any) -> None:
        log_event("partitions_assigned", partitions=_tps(args))
        parts.clear()  # rebuilt (grace restarts) after recovery, on the first record

    @app.timer(interval=TICK_S)
    async def ticker() -> None:
        # Timers fire on every worker and during rebalances: only tick partitions this
        # worker actively owns, and not while rebalancing or recovering tables.
        if app.rebalancing or getattr(app, "in_recovery", False) or gate.stopping:
            return
        now = time.time()
        behind = False
        for tp in app.assignor.assigned_actives():
            if tp.topic == topics.logs and logs_lag.get(tp.partition, 0.0) >= CAUGHT_UP_S:
                hw = app.consumer.highwater(tp)
                pos = await app.consumer.position(tp)
                behind = behind or hw is None or pos is None or hw > pos
        logs_caught_up[0] = not behind
        for tp in app.assignor.assigned_actives():
            if tp.topic == topics.signals:
                await signals_t.send(key=None, partition=tp.partition,
                                     value=encode_tick(now))

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

    return Processor(app=app, gate=gate, flush_states=flush_states, dirty_states=dirty_states)
