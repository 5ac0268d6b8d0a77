"""The Faust shell: topics, a table, two agents and two timers calling the stage methods."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import faust
import orjson

from faultwatch import settings
from faultwatch.core.diagnosis import is_probe
from faultwatch.core.events import Decision
from faultwatch.core.policy import Policy
from faultwatch.core.quota import NodeQuota
from faultwatch.core.registry import RegistryPolicy
from faultwatch.core.status import STATUS_S
from faultwatch.errors import DecodeError
from faultwatch.eventlog import Quiet, log_event
from faultwatch.holds.follow import follow_holds, holds_table
from faultwatch.kafka import calm as broker_calm
from faultwatch.kafka import clients
from faultwatch.metrics import ProcessorMetrics
from faultwatch.metrics import serve as serve_metrics
from faultwatch.registry.follow import RegistryLink
from faultwatch.registry.gate import NodeGate
from faultwatch.rollout.rules_status import WORKER_S, info_labels, worker_id, worker_record
from faultwatch.rollout.rules_watch import RulesWatcher, base_rules
from faultwatch.rules import Matcher, RuleSet
from faultwatch.streams import faust_compat
from faultwatch.streams.budget import LineBudget
from faultwatch.streams.counters import Metrics
from faultwatch.streams.faust_compat import (
    BatchFeed,
    PartitionBatches,
    QuietMonitor,
    TableStore,
    direct_delivery,
    keep_queues_when_flowing,
    reread_uncommitted_partitions,
)
from faultwatch.streams.incident_publish import IncidentPublisher
from faultwatch.streams.job_stage import (
    CAUGHT_UP_S,
    TICK_S,
    JobStage,
)
from faultwatch.streams.lemon_watch import LemonFeed, follow_incidents
from faultwatch.streams.matcher_stage import MatcherStage
from faultwatch.streams.records import InRecord, LiveRules
from faultwatch.streams.refusal_notices import RefusalNotices
from faultwatch.streams.status_publish import StatusPublisher
from faultwatch.streams.stopping import StopGate
from faultwatch.streams.tasks import supervised
from faultwatch.trust.replay import max_age_s
from faultwatch.wire import (
    decision_to_dict,
    encode_tick,
    job_key,
    signing,
    worker_key,
)
from faultwatch.wire.deadletter import encode_dead
from faultwatch.wire.topics import DEFAULT_PARTITIONS, Topics, processor_group

REPORT_S = 10.0  # the lag gauges of /metrics are refreshed this often
METRICS_LOG_S: float = settings.METRICS_LOG_S.fallback  # a processor_metrics line this often
BATCH = 1000  # records per batch, both stages
BATCH_WITHIN_S = 0.05  # ... or whatever arrived within this long
FEED_MAX = 4 * BATCH  # fetched records queued per topic before its fetching pauses
RETRY_FIRST_S, RETRY_MAX_S = 0.5, 30.0  # backoff of a batch whose outputs were not delivered

Send = Callable[[], Awaitable[Any]]  # starts one send; its result is awaited for delivery



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
        default_factory=lambda: settings.SESSION_TIMEOUT_S.value())
    policy_overrides: dict[str, Any] = field(default_factory=dict)  # flags, kept on push
    # the layers `ruleset`/`policy` were built from (rules.layers.RulesInForce; cli builds
    # it): a push adds its layer on top of them. None: one layer holding `ruleset`
    rules: Any = None
    metrics_port: int | None = None  # serve Prometheus /metrics on this port
    # upgrade aid, for one release: also publish the probes on the decisions topic, where
    # agents older than the control topic look for them (docs/decisions.md, "Upgrading")
    probes_on_decisions: bool = False
    # active jobs per worker; a new job beyond it is refused (docs/operating.md)
    max_jobs: int = field(
        default_factory=lambda: settings.MAX_JOBS.value())
    # a decided or done job unchanged this long leaves the worker's table (docs/operating.md)
    finished_ttl_s: float = field(
        default_factory=lambda: settings.FINISHED_TTL_S.value())
    # per node a minute (core/quota.py; docs/operating.md): new jobs, run-starts; 0: none
    node_new_jobs_per_min: float = field(
        default_factory=lambda: settings.NODE_NEW_JOBS_PER_MIN.value())
    node_run_starts_per_min: float = field(
        default_factory=lambda: settings.NODE_RUN_STARTS_PER_MIN.value())
    # the scheduler asked which nodes a job holds (streams/allocations.py); None: unchecked
    allocations: Any = None
    # no decision whose evidence is older than this is published (docs/decisions.md)
    max_decision_age_s: float = field(default_factory=max_age_s)
    # lines per second each node may have matched; past it counted and announced, not
    # matched (streams/budget.py, docs/operating.md); 0: no budget
    node_lines_per_s: float = field(default_factory=lambda: settings.NODE_LINES_PER_S.value())
    # the incidents and acted topics drop what is older (docs/goodput.md)
    incidents_retention_s: float = field(
        default_factory=lambda: settings.INCIDENTS_RETENTION_S.value())
    # one processor_metrics event line this often (rates and lags live on /metrics)
    metrics_log_s: float = field(default_factory=lambda: settings.METRICS_LOG_S.value())
    metrics_address: str = "127.0.0.1"  # ... on this address (0.0.0.0: every interface)
    metrics_address_file: str | None = None  # where /metrics listens (file_sd JSON)

    @property
    def group(self) -> str:
        return processor_group(self.topics.prefix, self.app_id)


def _serve_metrics(cfg: ProcessorConfig, prom: ProcessorMetrics) -> None:
    """/metrics on --metrics-port (0: a free one; a taken port is a usage error, exit 2),
    and where it listens in --metrics-address-file, removed at exit."""
    from faultwatch import metrics

    server = serve_metrics(cfg.metrics_port or 0, prom.registry, addr=cfg.metrics_address)
    target, path = metrics.announce(server, cfg.metrics_address, cfg.metrics_address_file,
                                    cfg.group)
    log_event("metrics_listening", address=target, address_file=path)


@dataclass
class Processor:
    """A worker: its Faust app, both stages, the rules in effect and their watcher, and the
    gate every batch passes (for a bounded stop)."""

    app: faust.App
    matcher: MatcherStage
    jobs: JobStage
    live: LiveRules
    watcher: RulesWatcher
    gate: StopGate
    metrics: Metrics
    # removes this worker's record from the status topic (a clean stop)
    forget_worker: Callable[[], Awaitable[Any]] | None = None
    assigned_once: bool = False  # the worker got partitions at least once (startup done)

    def flush_states(self) -> int:
        return self.jobs.flush(time.time())

    def dirty_states(self) -> int:
        return self.jobs.dirty


def _data_root() -> Path:
    """Where Faust keeps its per-app metadata: $FAULTWATCH_PROCESSOR_DIR or the user cache."""
    root = settings.PROCESSOR_DIR.get() or Path.home() / ".cache" / "faultwatch" / "processor"
    root.mkdir(parents=True, exist_ok=True)  # Faust creates only the last path component
    return root


def _records(messages: list[Any]) -> list[InRecord]:
    """The stages' view of fetched messages: raw key and value bytes as consumed (the
    stages decode each value once), and the headers."""
    from faultwatch.trust.nodesig import header_pairs

    return [InRecord(m.topic, m.partition, m.offset, m.key,
                     m.value if isinstance(m.value, bytes | None) else None,
                     header_pairs(m.headers) if m.headers else ())
            for m in messages]


async def deliver(sends: list[Send], what: str) -> None:
    """Start every send in order and wait until all are delivered. A failure retries the
    failed sends (in order) with backoff until they are delivered: the batch stays in
    progress, so its source events are not acknowledged and their offsets are never
    committed past what was delivered (at least once; consumers dedupe)."""
    backoff = RETRY_FIRST_S
    todo = sends
    while todo:
        futs: list[Any] = []
        failed_at: int | None = None
        err: BaseException | None = None
        for i, send in enumerate(todo):
            try:
                futs.append(await send())
            except Exception as e:  # noqa: BLE001 - raised at send time (size, closed)
                failed_at, err = i, e
                break  # later sends wait: they would overtake this one
        for i, r in enumerate(await asyncio.gather(*futs, return_exceptions=True)):
            if isinstance(r, BaseException):
                failed_at, err = i, r
                break
        if failed_at is None:
            return
        log_event("produce_failed", what=what, pending=len(todo) - failed_at,
                  retry_in_s=backoff, error=f"{type(err).__name__}: {err}")
        await asyncio.sleep(backoff)
        backoff = min(RETRY_MAX_S, backoff * 2)
        todo = todo[failed_at:]  # resent from the first failure on: order per key is kept


def _sender(topic: Any, key: bytes | None, value: bytes) -> Send:
    """A send of one record, started when called (force: not held until a commit)."""
    async def send() -> Any:
        return await topic.send(key=key, value=value, force=True)
    return send


def build_app(cfg: ProcessorConfig) -> faust.App:
    """A Faust app with both stages; several workers with the same config share partitions."""
    return build_processor(cfg).app


def build_processor(cfg: ProcessorConfig, live: LiveRules | None = None,
                    watcher: RulesWatcher | None = None) -> Processor:
    """The worker's app wired to the stages. `live`/`watcher` come from the caller when it
    already loaded the rules topic's current set (worker.run_worker does)."""
    faust_compat.slow_retries(broker_calm.RETRY_BACKOFF_MS)
    gate_logs = broker_calm.install()
    faust_compat.one_line_slow_processing()
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
        monitor=QuietMonitor(),  # no per-record statistics (no Faust web views to read them)
        **clients.faust_settings(),  # SSL/SASL (docs/operating.md)
    )
    topics = cfg.topics
    logs_t = app.topic(topics.logs, key_type=bytes, value_type=bytes, partitions=cfg.partitions)
    signals_t = app.topic(topics.signals, key_type=bytes, value_type=bytes,
                          partitions=cfg.partitions)
    decisions_t = app.topic(topics.decisions, key_type=bytes, value_type=bytes)
    control_t = app.topic(topics.control, key_type=bytes, value_type=bytes)
    dead_t = app.topic(topics.deadletter, key_type=bytes, value_type=bytes)
    table = app.Table("jobs", default=None, partitions=cfg.partitions, key_type=bytes,
                      value_type=bytes)
    reread_uncommitted_partitions(app, {topics.logs, topics.signals})
    keep_queues_when_flowing(app)  # recovery's second resume dropped fetched records
    direct_delivery(app)  # no four tasks per fetched message
    metrics = Metrics()
    prom = ProcessorMetrics()
    prom.watch(metrics)
    if cfg.metrics_port is not None:
        _serve_metrics(cfg, prom)
    # decisions and registry records are signed with the processor's Ed25519 key
    # ($FAULTWATCH_SIGNING_KEY_FILE; legacy: the HMAC decision key); rule sets, registry
    # records and (with node keys) logs records are checked against $FAULTWATCH_TRUST_FILE
    from faultwatch.trust.announce import announcement
    from faultwatch.trust.decisions import decision_signer, signer_key_id
    from faultwatch.trust.keys import NODE, load_signing_key, load_trust
    from faultwatch.trust.nodesig import NodeVerifier
    from faultwatch.trust.records import (
        LEDGER,
        NODE_RECORD,
        RecordGate,
        signer_for,
        verifier_for,
    )
    from faultwatch.trust.refusals import REFUSALS, refusals_summary

    keyring = decision_signer()
    trust = load_trust()
    node_verifier = NodeVerifier(trust) if trust is not None and trust.of_role(NODE) else None
    log_event("decision_signing", signed=keyring is not None, key_id=signer_key_id(keyring),
              trust_file=trust.source if trust else None,
              node_keys=len(trust.of_role(NODE)) if trust else 0)
    if cfg.allocations is not None:
        log_event("allocation_checking", scheduler=cfg.allocations.kind)
    elif node_verifier is not None:
        log_event("allocation_unchecked", backend="process",
                  hint="node keys prove which node wrote a record, not that the job runs "
                       "there: give --allocation-check slurm|kubernetes|exec so a node "
                       "may only speak for the jobs the scheduler placed on it")
    if live is None:
        live = LiveRules(Matcher(cfg.ruleset), cfg.policy, cfg.ruleset.version)
    if watcher is None:
        watcher = RulesWatcher(cfg.bootstrap, topics.rules, live, base_rules(
            cfg.ruleset, cfg.policy, cfg.rules, cfg.policy_overrides))
    dead: list[Send] = []  # dead letters of the batch in progress (and refusal notices)
    refusal_notices = RefusalNotices()
    # one line per reason and source in full, then a count per interval (every record still
    # goes to the dead-letter topic): 10,000 forged records were 10,000 lines
    dead_log = Quiet(log_event, {"dead_letter"}, interval_s=REPORT_S * 6)

    def dead_letter(rec: InRecord, err: Exception) -> None:
        err_text = str(err) if isinstance(err, DecodeError) else f"{type(err).__name__}: {err}"
        reason = getattr(err, "reason", None) or type(err).__name__
        dead_log("dead_letter", reason=f"{reason}:{rec.topic.rsplit('.', 1)[-1]}",
                 topic=rec.topic, partition=rec.partition, offset=rec.offset,
                 key=(rec.key or b"").decode(errors="replace")[:200], error=err_text)
        value = encode_dead(rec.topic, rec.partition, rec.offset, err_text, rec.value)
        dead.append(_sender(dead_t, rec.key, value))
        about = getattr(err, "about", None)
        if about is not None:  # a refused node signature: that job's agents are told why
            notice = refusal_notices.take(about, getattr(err, "reason", ""),
                                          getattr(err, "detail", ""), time.time(),
                                          live.rules_version)
            if notice is not None:
                dead.append(_sender(control_t, job_key(notice.job),
                                    signing.encode(decision_to_dict(notice), keyring)))

    matcher = MatcherStage(live, dead_letter, metrics, node_verifier=node_verifier,
                           budget=LineBudget(cfg.node_lines_per_s))
    jobs = JobStage(live, TableStore(table), dead_letter, metrics, max_jobs=cfg.max_jobs,
                    finished_ttl_s=cfg.finished_ttl_s,
                    max_decision_age_s=cfg.max_decision_age_s)
    # the node registry: every worker follows all of it; the job stage gates run-starts and
    # check notes with it and writes what its decisions change (docs/schedulers.md)
    registry = RegistryLink(
        cfg.bootstrap, topics.nodes, RegistryPolicy(quarantine_s=cfg.policy.blacklist_s),
        gate=RecordGate("node_record", verifier_for(NODE_RECORD, trust), log_event),
        signer=signer_for(NODE_RECORD, load_signing_key()))
    jobs.quota = NodeQuota(cfg.node_new_jobs_per_min, cfg.node_run_starts_per_min)
    jobs.gate = NodeGate(registry.writer.quarantined, registry.writer.state, quota=jobs.quota,
                         refused=jobs.refused_start)
    # operators' holds of jobs (`faultwatch jobs hold`): every worker follows all of them
    holds = holds_table()
    jobs.holds = holds.hold_of
    gate = StopGate()
    proc = Processor(app=app, matcher=matcher, jobs=jobs, live=live, watcher=watcher,
                     gate=gate, metrics=metrics)

    def take_dead() -> list[Send]:
        out = dead[:]
        dead.clear()
        return out

    # both topics reach the stages as batches of raw messages (faust_compat.BatchFeed): no
    # Faust Event, codec or stream per record; a batch is acknowledged (its offsets may be
    # committed) only after its outputs are delivered, inside the stop gate
    logs_feed = BatchFeed(app, logs_t, FEED_MAX)
    signals_out = PartitionBatches(app, topics.signals)  # one produce batch per partition
    signals_feed = BatchFeed(app, signals_t, FEED_MAX)

    @app.agent(logs_t)
    async def match(stream: faust.StreamT) -> None:
        logs_feed.subscribe()
        async for msgs in logs_feed.batches(BATCH, BATCH_WITHIN_S):
            async with gate.batch():
                recs = _records(msgs)
                prom.consumed("matcher", topics.logs, len(recs),
                              sum(len(r.value or b"") for r in recs))
                out = matcher.process_batch(recs, time.time())
                await deliver(await signals_out.sends(out) + take_dead(), "signals")
                logs_feed.ack(msgs)

    def publish(decs: list[Decision]) -> list[Send]:
        sends: list[Send] = []
        for d in decs:
            metrics.decisions += 1
            metrics.count_labelled("decisions.", d.kind)
            log_event("decision", id=d.id, job=d.job, attempt=d.attempt, action=d.action,
                      kind=d.kind, rule=d.rule)
            prom.decided(d.kind, d.action, time.time() - d.ts)
            value = signing.encode(decision_to_dict(d), keyring)
            if is_probe(d):  # control traffic: the agents' channel, not the decisions topic
                sends.append(_sender(control_t, job_key(d.job), value))
                if not cfg.probes_on_decisions:
                    continue
            sends.append(_sender(decisions_t, job_key(d.job), value))
        return sends

    @app.agent(signals_t)
    async def decide(stream: faust.StreamT) -> None:
        signals_feed.subscribe()
        async for msgs in signals_feed.batches(BATCH, BATCH_WITHIN_S):
            async with gate.batch():
                recs = _records(msgs)
                prom.consumed("job", topics.signals, len(recs),
                              sum(len(r.value or b"") for r in recs))
                if cfg.allocations is not None:  # the scheduler's word on new run-starts
                    jobs.answers = await cfg.allocations.for_batch(
                        jobs.allocation_requests(recs))
                decs = jobs.process_batch(recs, time.time())
                # decisions delivered before the batch is acknowledged (at least once)
                await deliver(publish(decs) + take_dead(), "decisions")
                await registry.publish(decs, time.time())
                signals_feed.ack(msgs)

    def _tps(args: tuple[Any, ...], topic: str | None = None) -> list[Any]:
        tps = args[0] if args else ()
        return [tp for tp in tps if tp.topic in ((topic,) if topic else
                                                 (topics.logs, topics.signals))]

    def _names(tps: list[Any]) -> str:
        return ",".join(sorted(f"{tp.topic.rsplit('.', 1)[-1]}/{tp.partition}"
                               for tp in tps)) or "-"

    @app.on_partitions_revoked.connect  # type: ignore[arg-type]
    async def on_revoked(sender: Any, *args: Any, signal: Any = None, **kwargs: Any) -> None:
        matcher.on_revoked(tp.partition for tp in _tps(args, topics.logs))
        written = jobs.on_revoked([tp.partition for tp in _tps(args, topics.signals)],
                                  time.time())
        log_event("partitions_revoked", partitions=_names(_tps(args)), states_written=written)

    @app.on_partitions_assigned.connect  # type: ignore[arg-type]
    async def on_assigned(sender: Any, *args: Any, signal: Any = None, **kwargs: Any) -> None:
        matcher.on_assigned(tp.partition for tp in _tps(args, topics.logs))
        jobs.on_assigned(tp.partition for tp in _tps(args, topics.signals))
        proc.assigned_once = True
        log_event("partitions_assigned", partitions=_names(_tps(args)))

    @app.timer(interval=TICK_S)
    async def ticker() -> None:
        # Timers fire on every worker and during rebalances: only tick partitions this
        # worker actively owns, and not while rebalancing, recovering or stopping.
        if app.rebalancing or getattr(app, "in_recovery", False) or gate.stopping:
            return
        now = time.time()
        behind = False
        for tp in app.assignor.assigned_actives():
            # behind: the latest record processed is old in event time and more wait (the
            # stage's own offset: the consumer's position runs ahead, in its fetch buffers)
            if tp.topic == topics.logs and matcher.logs_lag_s.get(tp.partition, 0.0) >= CAUGHT_UP_S:
                hw = app.consumer.highwater(tp)
                done = matcher.logs_next_offset.get(tp.partition)
                behind = behind or hw is None or done is None or hw > done
        jobs.logs_caught_up = not behind
        for tp in app.assignor.assigned_actives():
            if tp.topic == topics.signals:
                await signals_t.send(key=None, partition=tp.partition, value=encode_tick(now))

    last_report = [time.time(), 0, 0, 0]

    @app.timer(interval=REPORT_S)
    async def report() -> None:
        dead_log.tick()  # the counts of dead letters since their first lines
        now = time.time()
        lag: dict[str, int] = {}
        try:
            for tp in app.assignor.assigned_actives():
                if tp.topic in (topics.logs, topics.signals):
                    pos = await app.consumer.position(tp)
                    hw = app.consumer.highwater(tp)
                    if pos is not None and hw is not None:
                        lag[f"{tp.topic.rsplit('.', 1)[-1]}/{tp.partition}"] = max(0, hw - pos)
                        prom.set_lag(tp.topic, tp.partition, hw - pos)
        except Exception:  # noqa: BLE001 - metrics must never stop the worker
            pass
        prom.jobs.set(sum(len(p.active) for p in jobs.parts.values()))
        dt = now - last_report[0]
        if dt < cfg.metrics_log_s:  # the line is a summary for people: /metrics has the rest
            return
        rates = {"records_per_s": round((metrics.records - last_report[1]) / dt, 1),
                 "lines_per_s": round((metrics.lines - last_report[2]) / dt, 1),
                 "signals_per_s": round((metrics.jobs_signals - last_report[3]) / dt, 1)}
        last_report[:] = [now, metrics.records, metrics.lines, metrics.jobs_signals]
        log_event("processor_metrics", records=metrics.records, lines=metrics.lines,
                  signals=metrics.signals, signals_records=metrics.signals_records,
                  job_signals=metrics.jobs_signals, decisions=metrics.decisions,
                  dead_letters=metrics.dead_letters, consumer_lag=lag,
                  tick_lag_s=dict(metrics.tick_lag_s),
                  logs_event_lag_s=round(metrics.logs_event_lag_s, 3),
                  jobs_cached=sum(len(p.cache) for p in jobs.parts.values()),
                  jobs_active=sum(len(p.active) for p in jobs.parts.values()),
                  jobs_finished=metrics.jobs_finished,
                  rates=rates, counters=dict(metrics.extra))

    @app.timer(interval=broker_calm.POLL_S)
    async def broker_state() -> None:
        broker_calm.install(gate_logs)  # loggers created since the worker started
        gate_logs.poll(time.time())

    status_t = app.topic(topics.status, key_type=bytes, value_type=bytes)
    statuses = StatusPublisher()
    incidents_t = app.topic(topics.incidents, key_type=bytes, value_type=bytes)
    incidents = IncidentPublisher()  # run ledgers: incidents and goodput (docs/goodput.md)
    ledger_signer = signer_for(LEDGER, load_signing_key())
    lemons = LemonFeed(RecordGate("ledger", verifier_for(LEDGER, trust), log_event))
    prom.watch_goodput(incidents.board, lambda: len(lemons.lemons(time.time())))
    worker, started_at = worker_id(), time.time()
    published: list[Any] = [None, 0.0]  # (rules version, refusals) last published, when
    prom.watch_rules(lambda: info_labels(watcher.rules), lambda: watcher.rejected)

    announced = announcement(trust)  # the trust policy operators' commands check

    async def publish_worker(now: float) -> None:
        """This worker's record (the rules it runs, their layers and sources, the trust
        policy it announces and the records it refused) for `rules show`, `status` and the
        operators' commands: when they change (a refused agent record waits for the
        refresh), else every WORKER_S."""
        state = (live.rules_version, watcher.rejected,
                 sum(n for (what, _), n in REFUSALS.items() if what != "logs"))
        if state == published[0] and now - published[1] < WORKER_S:
            return
        await status_t.send(key=worker_key(worker), value=worker_record(
            worker, cfg.group, watcher.rules, now, started_at, watcher.rejected,
            watcher.last_rejected, announced, refusals_summary()))
        published[:] = [state, now]

    async def forget_worker() -> None:
        await status_t.send(key=worker_key(worker), value=None)

    proc.forget_worker = forget_worker

    async def announce_at_start() -> None:
        """The worker's record as soon as it serves partitions (not a STATUS_S tick later):
        operators' commands check their writes against the trust policy it announces."""
        while not proc.assigned_once:
            await asyncio.sleep(0.2)
        try:
            await publish_worker(time.time())
        except Exception as e:  # noqa: BLE001 - the timer publishes it again
            log_event("produce_failed", what="worker record", error=f"{type(e).__name__}: {e}")

    app.task(supervised("announce_at_start", announce_at_start, forever=False))

    @app.timer(interval=STATUS_S)
    async def publish_status() -> None:
        """Snapshots of this worker's jobs for `faultwatch status` (what changed, and a
        bounded refresh of the rest: streams/status_publish.py), and the worker's record."""
        if gate.stopping or gate_logs.down_since is not None:
            return  # nothing to a broker that is away: aiokafka's sender retried those
            # sends in a loop that took 80 % of a core during a 20 s outage (CI); the next
            # tick after it returns publishes what changed
        await publish_worker(time.time())
        if app.rebalancing:
            return
        for key, value in statuses.due(list(jobs.parts.values()), time.time(), live.policy):
            await status_t.send(key=key, value=value)
        for key, value in incidents.due(list(jobs.parts.values()), jobs.retired_ledgers,
                                        time.time()):
            if ledger_signer is not None:
                value = orjson.dumps(ledger_signer.sign_record(orjson.loads(value)))
            await incidents_t.send(key=key, value=value)

    async def publish_lemons(decs: list[Decision]) -> None:
        """Lemon notices: published by the worker owning signals partition 0 only."""
        if not any(tp.topic == topics.signals and tp.partition == 0
                   for tp in app.assignor.assigned_actives()):
            return
        await deliver(publish(decs), "decisions")
        await registry.publish(decs, time.time())  # a `quarantine` lemon policy

    async def lemon_follower() -> None:
        await follow_incidents(cfg.bootstrap, topics.incidents, lemons,
                               lambda: (live.policy, live.rules_version), publish_lemons)

    app.task(supervised("lemon_follower", lemon_follower))

    async def rules_watcher() -> None:
        await watcher.run()

    app.task(supervised("rules_watcher", rules_watcher))

    async def registry_follower() -> None:
        await registry.follow()

    app.task(supervised("registry_follower", registry_follower))

    async def holds_follower() -> None:
        await follow_holds(cfg.bootstrap, topics.holds, holds)

    app.task(supervised("holds_follower", holds_follower))
    return proc
