"""Prometheus metrics of a processor or an agent, served on /metrics by prometheus_client."""

from __future__ import annotations

import collections
import contextlib
import os
import platform
import socket
import threading
from collections.abc import Callable, Iterator, Mapping
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, Literal, Protocol, TypedDict

from faultwatch import __version__, settings
from faultwatch.errors import ConfigError

try:  # prometheus_client is a light optional dependency of the node side
    from prometheus_client import (
        CONTENT_TYPE_LATEST,
        CollectorRegistry,
        Counter,
        Gauge,
        Histogram,
        ProcessCollector,
        generate_latest,
    )
    from prometheus_client.core import (
        CounterMetricFamily,
        GaugeMetricFamily,
        HistogramMetricFamily,
    )
    from prometheus_client.registry import Collector
except ImportError:  # pragma: no cover - reported by serve()
    CollectorRegistry = None  # type: ignore[assignment,misc]

# Records refused in this process, by (what, reason): decision, rules, node_record, logs,
# actuate (signatures, node identity, the replay rule); `faultwatch_refused_total` reads it.
REFUSALS: collections.Counter[tuple[str, str]] = collections.Counter()

LATENCY_BUCKETS_S = (0.001, 0.005, 0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)


DEFAULT_ADDRESS = "127.0.0.1"  # loopback unless the operator opens it (--metrics-address)
READ_TIMEOUT_S = 5.0  # a client that has not sent its request by then is cut off
MAX_CONNECTIONS = 16  # concurrent scrapes served; more are closed at once


class _MetricsHandler(BaseHTTPRequestHandler):
    """GET /metrics (or /): the registry in the Prometheus text format; nothing else."""

    timeout = READ_TIMEOUT_S  # the socket timeout of every read: a slow client times out
    registry: Any = None

    def do_GET(self) -> None:  # noqa: N802 - http.server's naming
        if self.path.split("?", 1)[0] not in ("/metrics", "/"):
            self.send_error(404)
            return
        body = generate_latest(self.registry)
        self.send_response(200)
        self.send_header("Content-Type", CONTENT_TYPE_LATEST)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002
        pass  # no access log on the training job's stderr


class BoundedHTTPServer(ThreadingHTTPServer):
    """A thread per connection, at most `max_connections` at once: a connection beyond
    that is closed at once (a scraper retries next interval), so slow or idle clients cannot
    pile up threads."""

    daemon_threads = True
    request_queue_size = 16

    def __init__(self, addr: tuple[str, int], handler: type[BaseHTTPRequestHandler],
                 max_connections: int = MAX_CONNECTIONS) -> None:
        self._slots = threading.BoundedSemaphore(max_connections)
        self.refused = 0
        super().__init__(addr, handler)

    def process_request(self, request: Any, client_address: Any) -> None:
        if not self._slots.acquire(blocking=False):
            self.refused += 1
            self.shutdown_request(request)
            return
        try:
            super().process_request(request, client_address)
        except BaseException:
            self._slots.release()
            raise

    def process_request_thread(self, request: Any, client_address: Any) -> None:
        try:
            super().process_request_thread(request, client_address)
        finally:
            self._slots.release()


def serve(port: int, registry: Any, addr: str = DEFAULT_ADDRESS,
          read_timeout_s: float = READ_TIMEOUT_S,
          max_connections: int = MAX_CONNECTIONS) -> BoundedHTTPServer:
    """Serve `registry` on http://addr:port/metrics from a daemon thread: reads time out
    after `read_timeout_s`, at most `max_connections` are served at once. Port 0 takes a
    free port; `bound_port(server)` says which."""
    if CollectorRegistry is None:
        raise ConfigError("metrics_port", "prometheus_client is not installed "
                                          "(pip install prometheus_client)")
    if not 0 <= port < 65536:
        raise ConfigError("metrics_port", f"{port} is not a TCP port (0: a free one)")
    handler = type("MetricsHandler", (_MetricsHandler,),
                   {"registry": registry, "timeout": read_timeout_s})
    try:
        if ":" in addr:
            server: BoundedHTTPServer = type("BoundedHTTPServer6", (BoundedHTTPServer,),
                                             {"address_family": socket.AF_INET6})(
                (addr, port), handler, max_connections)
        else:
            server = BoundedHTTPServer((addr, port), handler, max_connections)
    except (OSError, OverflowError) as e:
        why = getattr(e, "strerror", None) or str(e)
        hint = " (--metrics-port 0 takes a free port)" if port else ""
        raise ConfigError("metrics_address", f"cannot listen on {addr}:{port}: {why}{hint}"
                          ) from e
    threading.Thread(target=server.serve_forever, name="faultwatch-metrics",
                     daemon=True).start()
    return server


def bound_port(server: BoundedHTTPServer) -> int:
    """The TCP port `server` listens on (the free one it took for port 0)."""
    return int(server.server_address[1])


def scrape_target(addr: str, port: int) -> str:
    """`host:port` a scraper on another machine uses: a wildcard address (0.0.0.0, ::)
    becomes this host's name (no DNS lookup: the launch never waits on a resolver), an IPv6
    address gets brackets."""
    host = addr
    if addr in ("", "0.0.0.0", "::"):
        host = socket.gethostname()
    elif ":" in addr:
        host = f"[{addr}]"
    return f"{host}:{port}"


ADDRESS_FILE_FIELDS = ("job", "node", "pid")


def address_file_path(template: str, **fields: str) -> Path:
    """The address file's path: `{job}`, `{node}` and `{pid}` in `template` are filled in
    (several agents of one host write one file each)."""
    rest = template
    for key in ADDRESS_FILE_FIELDS:
        rest = rest.replace("{" + key + "}", "")
    if "{" in rest or "}" in rest:
        raise ConfigError("metrics_address_file",
                          f"{template!r}: placeholders are {{job}}, {{node}} and {{pid}}")
    values = {"pid": str(os.getpid()), **fields}
    out = template
    for key in ADDRESS_FILE_FIELDS:
        out = out.replace("{" + key + "}", values.get(key, ""))
    return Path(out)


def check_address_file(template: str | None, port: int | None) -> None:
    """At start, before anything runs: an unknown placeholder, or a file without a port."""
    if template is None:
        return
    if port is None:
        raise ConfigError("metrics_address_file", "needs --metrics-port (0: a free port)")
    address_file_path(template)


def write_address_file(path: Path, target: str) -> None:
    """Say where /metrics listens, as a Prometheus file_sd target list:
    `[{"targets": ["host:port"], "labels": {}}]`, written whole (a reader never sees a half
    file). No target labels: the metrics carry their own (job_name, node), and a target
    label of the same name would rename them to exported_*. Raises OSError."""
    import json

    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps([{"targets": [target], "labels": {}}]) + "\n")
    os.replace(tmp, path)


def remove_address_file(path: Path) -> None:
    """Remove the address file at exit (a file_sd scraper then drops the target)."""
    with contextlib.suppress(OSError):
        path.unlink()


_TO_REMOVE: list[Path] = []  # address files this process removes when it leaves


def remove_at_exit(path: Path) -> None:
    """Remove `path` when the process exits, normally (atexit) or through
    `remove_address_files()` (a processor leaves with os._exit, which skips atexit)."""
    import atexit

    if not _TO_REMOVE:
        atexit.register(remove_address_files)
    _TO_REMOVE.append(path)


def announce(server: BoundedHTTPServer, addr: str, address_file: str | None,
             job: str) -> tuple[str, Path | None]:
    """Where `server` listens, as a scrape target, written to the address file (file_sd) from
    its template when given and removed at exit (ConfigError if unwritable): (target, path)
    for the caller's `metrics_listening` line."""
    target = scrape_target(addr, bound_port(server))
    path = None
    if address_file:
        path = address_file_path(address_file, job=job, node=socket.gethostname())
        try:
            write_address_file(path, target)
        except OSError as e:
            raise ConfigError("metrics_address_file", f"cannot write {path}: {e}") from e
        remove_at_exit(path)
    return target, path


def remove_address_files() -> None:
    while _TO_REMOVE:
        remove_address_file(_TO_REMOVE.pop())


class BuildInfoCollector:
    """`faultwatch_build_info{component,version,python,...}` = 1: which release runs where
    (an agent's also carries job_name and node, to join its process metrics on `instance`)."""

    def __init__(self, component: str, labels: Mapping[str, str] | None = None):
        self._labels = {**(labels or {}), "component": component, "version": __version__,
                        "python": platform.python_version()}

    def collect(self) -> Iterator[Any]:
        fam = GaugeMetricFamily("faultwatch_build_info", "The faultwatch release running "
                                "(always 1)", labels=sorted(self._labels))
        fam.add_metric([self._labels[k] for k in sorted(self._labels)], 1.0)
        yield fam

    def describe(self) -> Iterator[Any]:
        return iter(())


def add_process_metrics(registry: Any, component: str,
                        labels: Mapping[str, str] | None = None) -> None:
    """The process's own CPU, memory, file descriptors and start time (prometheus_client's
    process collector: `process_cpu_seconds_total`, `process_resident_memory_bytes`, ...;
    Linux only, empty elsewhere) and `faultwatch_build_info`."""
    ProcessCollector(registry=registry)
    registry.register(BuildInfoCollector(component, labels))


class ProcessorMetrics:
    """The processor's metrics. The Faust shell counts records, bytes and decisions and sets
    lag and jobs; the stages' own counters (lines, signals, dead letters, event lag) are
    read at scrape time from the object `watch` is given."""

    def __init__(self) -> None:
        r = self.registry = CollectorRegistry(auto_describe=True)
        self.records = Counter("faultwatch_records", "Records consumed, by stage and topic",
                               ["stage", "topic"], registry=r)
        self.bytes = Counter("faultwatch_record_bytes", "Record bytes consumed, by stage",
                             ["stage"], registry=r)
        self.decisions = Counter("faultwatch_decisions", "Decisions published",
                                 ["kind", "action"], registry=r)
        self.lag = Gauge("faultwatch_consumer_lag", "Records behind the end of the partition",
                         ["topic", "partition"], registry=r)
        self.jobs = Gauge("faultwatch_jobs_tracked", "Active jobs this worker holds",
                          registry=r)
        self.latency = Histogram("faultwatch_latency_seconds",
                                 "Latencies: decision (decided to published)",
                                 ["what"], buckets=LATENCY_BUCKETS_S, registry=r)
        add_process_metrics(r, "processor")

    def consumed(self, stage: str, topic: str, records: int, nbytes: int) -> None:
        self.records.labels(stage, topic).inc(records)
        self.bytes.labels(stage).inc(nbytes)

    def decided(self, kind: str, action: str, publish_delay_s: float | None = None) -> None:
        """A decision is published; publish_delay_s: now minus the decision's own time."""
        self.decisions.labels(kind, action).inc()
        if publish_delay_s is not None and publish_delay_s >= 0:
            self.latency.labels("decision").observe(publish_delay_s)

    def set_lag(self, topic: str, partition: int, lag: int) -> None:
        self.lag.labels(topic, str(partition)).set(max(0, lag))

    def watch_rules(self, info: Callable[[], Mapping[str, str]],
                    rejected: Callable[[], int]) -> None:
        """Expose the rules in force, read at every scrape: `faultwatch_rules_info` (1, with
        labels version, source = the top layer, layers, push_id) and the refused pushes."""
        self.registry.register(_RulesCollector(info, rejected))

    def watch_goodput(self, board: Any, lemons: Callable[[], int]) -> None:
        """Expose what the worker published on the incidents topic (a
        streams.incident_publish.GoodputBoard, read at every scrape) and the lemon nodes its
        watch names now (docs/goodput.md)."""
        self.registry.register(_GoodputCollector(board, lemons))

    def watch(self, counters: StageCounters) -> None:
        """Expose the stages' counters (a streams/counters.Metrics), read at every scrape."""
        self.registry.register(_StageCollector(counters))
        self.registry.register(RefusalCollector())


class StormState(Protocol):
    """The blast-radius guard's state as /metrics reads it (core/blast.GuardState)."""

    @property
    def holding(self) -> bool: ...
    @property
    def episode(self) -> int: ...
    @property
    def held(self) -> int: ...
    @property
    def lapsed(self) -> int: ...


class StageCounters(Protocol):
    """What /metrics reads of a processor worker's counters (streams/counters.Metrics): typed,
    so renaming a counter there fails mypy at `watch()`, not a dashboard."""

    @property
    def lines(self) -> int: ...
    @property
    def signals(self) -> int: ...
    @property
    def dead_letters(self) -> int: ...
    @property
    def logs_event_lag_s(self) -> float: ...
    @property
    def jobs_cached(self) -> int: ...
    @property
    def max_jobs(self) -> int: ...
    @property
    def jobs_finished(self) -> int: ...
    @property
    def storm(self) -> StormState: ...

    def counted(self, name: Literal["jobs_refused", "jobs_expired", "lines_throttled",
                                    "nodes_throttled"]) -> int: ...


class _StageCollector:
    def __init__(self, counters: StageCounters):
        self._c = counters

    def collect(self) -> Iterator[Any]:
        c = self._c
        for name, n, doc in (("faultwatch_lines", c.lines, "Log lines matched"),
                             ("faultwatch_signals", c.signals, "Signals produced"),
                             ("faultwatch_dead_letters", c.dead_letters,
                              "Records dead-lettered")):
            fam = CounterMetricFamily(name, doc)
            fam.add_metric([], float(n))
            yield fam
        lag = GaugeMetricFamily("faultwatch_logs_event_lag_seconds",
                                "Processor time minus the event time of the latest line")
        lag.add_metric([], float(c.logs_event_lag_s))
        yield lag
        for name, n, doc in (
                ("faultwatch_jobs_cached", c.jobs_cached,
                 "Job states decoded in the worker's cache (idle ones leave it)"),
                ("faultwatch_jobs_max", c.max_jobs, "The cap on active jobs per worker"),
                ("faultwatch_jobs_finished", c.jobs_finished,
                 "Decided and done jobs in the worker's table (they leave after the TTL)")):
            jobs = GaugeMetricFamily(name, doc)
            jobs.add_metric([], float(n or 0))
            yield jobs
        refused = CounterMetricFamily("faultwatch_jobs_refused",
                                      "New jobs refused at the cap on active jobs")
        refused.add_metric([], float(c.counted("jobs_refused")))
        yield refused
        expired = CounterMetricFamily("faultwatch_jobs_expired",
                                      "Decided and done jobs deleted from the worker's table "
                                      f"after {settings.FINISHED_TTL_S}")
        expired.add_metric([], float(c.counted("jobs_expired")))
        yield expired
        for name, n, doc in (
                ("faultwatch_lines_throttled", c.counted("lines_throttled"),
                 "Lines counted but not matched: their node was over its line budget "
                 f"({settings.NODE_LINES_PER_S})"),
                ("faultwatch_nodes_throttled", c.counted("nodes_throttled"),
                 "Throttling episodes started (a node over its line budget)")):
            thr = CounterMetricFamily(name, doc)
            thr.add_metric([], float(n))
            yield thr
        storm = c.storm
        for name, value, doc in (
                ("faultwatch_fleet_storm_holding", storm.holding,
                 "1 while the blast-radius guard holds the actions of jobs lost together"),
                ("faultwatch_fleet_storm_held_jobs", storm.held, "Jobs whose actions are held"),
                ("faultwatch_fleet_storm_lapsed_jobs", storm.lapsed,
                 "Jobs still silent after the hold ran out, decided at a bounded rate"),
                ("faultwatch_fleet_storm_episodes", storm.episode,
                 "Blast-radius episodes since the worker started")):
            g = (CounterMetricFamily if name.endswith("episodes") else GaugeMetricFamily)(
                name, doc)
            g.add_metric([], float(value))
            yield g

    def describe(self) -> Iterator[Any]:
        return iter(())


class _GoodputCollector:
    def __init__(self, board: Any, lemons: Callable[[], int]):
        self._b, self._lemons = board, lemons

    def collect(self) -> Iterator[Any]:
        b = self._b
        ratio = GaugeMetricFamily("faultwatch_job_goodput_ratio", "A job run's productive "
                                  "time over its wall time so far (ETTR; the newest runs "
                                  "this worker published)", labels=["job_name"])
        for job, r in list(b.ratios.items()):
            ratio.add_metric([job], float(r))
        yield ratio
        prod = CounterMetricFamily("faultwatch_productive_seconds", "Productive training "
                                   "time of the runs this worker published")
        prod.add_metric([], float(b.seconds.get("productive", 0.0)))
        yield prod
        bad = CounterMetricFamily("faultwatch_badput_seconds", "Wall time of the runs this "
                                  "worker published that was not productive, by cause",
                                  labels=["cause"])
        for cause, v in sorted(b.seconds.items()):
            if cause != "productive":
                bad.add_metric([cause], float(v))
        yield bad
        hist = HistogramMetricFamily("faultwatch_incident_recovery_seconds", "From an "
                                     "incident's first sign to the first progress after "
                                     "its restart")
        buckets = [(str(le), float(n)) for le, n in zip(b.bounds, b.buckets,
                                                        strict=True)]
        hist.add_metric([], buckets + [("+Inf", float(b.recovery_count))],
                        float(b.recovery_sum))
        yield hist
        lem = GaugeMetricFamily("faultwatch_lemon_nodes", "Nodes blamed in incidents of "
                                "lemon_min_jobs distinct jobs within lemon_window_s")
        lem.add_metric([], float(self._lemons()))
        yield lem

    def describe(self) -> Iterator[Any]:
        return iter(())


class RefusalCollector:
    """`faultwatch_refused_total{what,reason}`: records refused by signature or the replay
    rule in this process (faultwatch.trust.refusals.REFUSALS), read at scrape time."""

    def collect(self) -> Iterator[Any]:
        fam = CounterMetricFamily("faultwatch_refused", "Records refused (signature, node "
                                  "identity, replay rule), by what and reason",
                                  labels=["what", "reason"])
        for (what, reason), n in sorted(REFUSALS.items()):
            fam.add_metric([what, reason], float(n))
        yield fam

    def describe(self) -> Iterator[Any]:
        return iter(())


class _RulesCollector:
    def __init__(self, info: Callable[[], Mapping[str, str]], rejected: Callable[[], int]):
        self._info, self._rejected = info, rejected

    def collect(self) -> Iterator[Any]:
        info = self._info()
        names = sorted(info)
        fam = GaugeMetricFamily("faultwatch_rules_info", "The rule set this worker runs "
                                "(version, top layer, layers, push id)", labels=names)
        fam.add_metric([str(info[k]) for k in names], 1.0)
        yield fam
        rej = CounterMetricFamily("faultwatch_rules_rejected", "Pushed rule sets refused")
        rej.add_metric([], float(self._rejected()))
        yield rej

    def describe(self) -> Iterator[Any]:
        return iter(())


class AgentStats(TypedDict, total=False):
    """An agent's stats: its heartbeats carry them, /metrics reads them (AgentCollector), so
    a key renamed on one side fails mypy, not a dashboard."""

    lines_read: int
    lines_acked: int
    spool_depth: int
    spool_bytes: int
    drops: int
    ack_lag_s: float
    broker_up: bool
    tee_dropped_bytes: int
    mode: str  # `agent tail`: "tail"


class AgentCollector:
    """Reads an agent's own stats at scrape time (nothing to increment in the agent):
    `stats()` is the heartbeat stats dict, `child_alive()` whether the child runs."""

    def __init__(self, stats: Callable[[], AgentStats],
                 child_alive: Callable[[], bool], labels: Mapping[str, str]):
        self._stats, self._alive = stats, child_alive
        self._names = sorted(labels)
        self._values = [str(labels[k]) for k in self._names]

    def _g(self, name: str, doc: str, value: float, counter: bool = False) -> Any:
        cls = CounterMetricFamily if counter else GaugeMetricFamily
        fam = cls(name, doc, labels=self._names)
        fam.add_metric(self._values, value)
        return fam

    def collect(self) -> Iterator[Any]:
        s = self._stats()
        yield self._g("faultwatch_agent_lines_read", "Lines read from the child",
                      float(s.get("lines_read", 0)), counter=True)
        yield self._g("faultwatch_agent_lines_acked", "Lines the broker acknowledged",
                      float(s.get("lines_acked", 0)), counter=True)
        yield self._g("faultwatch_agent_spool_depth", "Records spooled, not yet acked",
                      float(s.get("spool_depth", 0)))
        yield self._g("faultwatch_agent_spool_bytes", "Bytes in the spool",
                      float(s.get("spool_bytes", 0)))
        yield self._g("faultwatch_agent_dropped_lines", "Lines lost (spool failures, cap)",
                      float(s.get("drops", 0)), counter=True)
        yield self._g("faultwatch_agent_ack_lag_seconds", "Age of the oldest unacked record",
                      float(s.get("ack_lag_s", 0.0)))
        yield self._g("faultwatch_agent_broker_up", "1 when the broker takes records",
                      1.0 if s.get("broker_up") else 0.0)
        yield self._g("faultwatch_agent_child_alive", "1 while the supervised command runs",
                      1.0 if self._alive() else 0.0)

    def describe(self) -> Iterator[Any]:
        return iter(())


def service_registry(component: str) -> Any:
    """The registry of a service with no metrics of its own (`actuate`, `notify`): what it
    refused (`faultwatch_refused_total`), its process metrics and `faultwatch_build_info`."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(RefusalCollector())
    add_process_metrics(registry, component)
    return registry


def agent_registry(stats: Callable[[], AgentStats], child_alive: Callable[[], bool],
                   labels: Mapping[str, str]) -> Any:
    """A registry holding one AgentCollector."""
    registry = CollectorRegistry(auto_describe=False)
    collector: Collector = AgentCollector(stats, child_alive, labels)
    registry.register(collector)
    registry.register(RefusalCollector())
    add_process_metrics(registry, "agent", labels)
    return registry
