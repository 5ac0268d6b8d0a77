"""Prometheus metrics of a processor or an agent, served on /metrics by prometheus_client."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from typing import Any

from faultwatch.errors import ConfigError

try:  # prometheus_client is a light optional dependency of the node side
    from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, start_http_server
    from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
    from prometheus_client.registry import Collector
except ImportError:  # pragma: no cover - reported by serve()
    CollectorRegistry = None  # type: ignore[assignment,misc]

LATENCY_BUCKETS_S = (0.001, 0.005, 0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)


def serve(port: int, registry: Any, addr: str = "0.0.0.0") -> None:
    """Serve `registry` on http://addr:port/metrics from a daemon thread."""
    if CollectorRegistry is None:
        raise ConfigError("metrics_port", "prometheus_client is not installed "
                                          "(pip install prometheus_client)")
    if not 0 < port < 65536:
        raise ConfigError("metrics_port", f"{port} is not a TCP port")
    try:
        start_http_server(port, addr=addr, registry=registry)
    except OSError as e:
        raise ConfigError("metrics_port", f"cannot listen on {addr}:{port}: {e.strerror}") from e


class ProcessorMetrics:
    """The processor's counters, gauges and histograms; the stages call the methods."""

    def __init__(self) -> None:
        r = self.registry = CollectorRegistry(auto_describe=True)
        self.records = Counter("faultwatch_records", "Records consumed, by stage and topic",
                               ["stage", "topic"], registry=r)
        self.lines = Counter("faultwatch_lines", "Log lines matched", registry=r)
        self.bytes = Counter("faultwatch_record_bytes", "Record bytes consumed, by stage",
                             ["stage"], registry=r)
        self.decisions = Counter("faultwatch_decisions", "Decisions published",
                                 ["kind", "action"], registry=r)
        self.dead_letters = Counter("faultwatch_dead_letters", "Records dead-lettered",
                                    ["stage"], registry=r)
        self.lag = Gauge("faultwatch_consumer_lag", "Records behind the end of the partition",
                         ["topic", "partition"], registry=r)
        self.jobs = Gauge("faultwatch_jobs_tracked", "Jobs whose state this worker holds",
                          registry=r)
        self.latency = Histogram("faultwatch_latency_seconds",
                                 "Latencies: logs_event (line written to matched), decision "
                                 "(decided to published)",
                                 ["what"], buckets=LATENCY_BUCKETS_S, registry=r)

    def consumed(self, stage: str, topic: str, nbytes: int) -> None:
        self.records.labels(stage, topic).inc()
        self.bytes.labels(stage).inc(nbytes)

    def matched_lines(self, nlines: int, event_lag_s: float) -> None:
        """A lines record matched; event_lag_s: now minus the event time of its last line."""
        self.lines.inc(nlines)
        if event_lag_s >= 0:
            self.latency.labels("logs_event").observe(event_lag_s)

    def decided(self, kind: str, action: str, publish_delay_s: float | None = None) -> None:
        """A decision is published; publish_delay_s: now minus the decision's own time."""
        self.decisions.labels(kind, action).inc()
        if publish_delay_s is not None and publish_delay_s >= 0:
            self.latency.labels("decision").observe(publish_delay_s)

    def dead_lettered(self, stage: str) -> None:
        self.dead_letters.labels(stage).inc()

    def set_lag(self, topic: str, partition: int, lag: int) -> None:
        self.lag.labels(topic, str(partition)).set(max(0, lag))


class AgentCollector:
    """Reads an agent's own stats at scrape time (nothing to increment in the agent):
    `stats()` is the heartbeat stats dict, `child_alive()` whether the child runs."""

    def __init__(self, stats: Callable[[], Mapping[str, Any]],
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
        num = {k: float(v) for k, v in s.items() if isinstance(v, int | float)}
        yield self._g("faultwatch_agent_lines_read", "Lines read from the child",
                      num.get("lines_read", 0.0), counter=True)
        yield self._g("faultwatch_agent_lines_acked", "Lines the broker acknowledged",
                      num.get("lines_acked", 0.0), counter=True)
        yield self._g("faultwatch_agent_spool_depth", "Records spooled, not yet acked",
                      num.get("spool_depth", 0.0))
        yield self._g("faultwatch_agent_spool_bytes", "Bytes in the spool",
                      num.get("spool_bytes", 0.0))
        yield self._g("faultwatch_agent_dropped_lines", "Lines lost (spool failures, cap)",
                      num.get("drops", 0.0), counter=True)
        yield self._g("faultwatch_agent_ack_lag_seconds", "Age of the oldest unacked record",
                      num.get("ack_lag_s", 0.0))
        yield self._g("faultwatch_agent_broker_up", "1 when the broker takes records",
                      1.0 if s.get("broker_up") else 0.0)
        yield self._g("faultwatch_agent_child_alive", "1 while the supervised command runs",
                      1.0 if self._alive() else 0.0)

    def describe(self) -> Iterator[Any]:
        return iter(())


def agent_registry(stats: Callable[[], Mapping[str, Any]], child_alive: Callable[[], bool],
                   labels: Mapping[str, str]) -> Any:
    """A registry holding one AgentCollector."""
    registry = CollectorRegistry(auto_describe=False)
    collector: Collector = AgentCollector(stats, child_alive, labels)
    registry.register(collector)
    return registry
