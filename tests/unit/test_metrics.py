"""Metric names, labels and values as Prometheus reads them (text exposition format)."""

from __future__ import annotations

from types import SimpleNamespace

from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from faultwatch.metrics import ProcessorMetrics, agent_registry


def samples(registry: object) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    text = generate_latest(registry).decode()  # type: ignore[arg-type]
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for fam in text_string_to_metric_families(text) for s in fam.samples}


def test_processor_metrics_count_by_label_and_read_the_stage_counters() -> None:
    m = ProcessorMetrics()
    stage = SimpleNamespace(lines=10, signals=4, dead_letters=1, logs_event_lag_s=0.5)
    m.watch(stage)
    m.consumed("matcher", "p.logs", 2, 150)
    m.decided("hang", "restart", publish_delay_s=0.2)
    m.decided("hang", "restart")
    m.set_lag("p.logs", 3, 42)
    m.jobs.set(2)
    s = samples(m.registry)
    assert s[("faultwatch_records_total", (("stage", "matcher"), ("topic", "p.logs")))] == 2
    assert s[("faultwatch_record_bytes_total", (("stage", "matcher"),))] == 150
    assert s[("faultwatch_decisions_total", (("action", "restart"), ("kind", "hang")))] == 2
    assert s[("faultwatch_consumer_lag", (("partition", "3"), ("topic", "p.logs")))] == 42
    assert s[("faultwatch_jobs_tracked", ())] == 2
    assert s[("faultwatch_latency_seconds_count", (("what", "decision"),))] == 1
    assert s[("faultwatch_lines_total", ())] == 10
    assert s[("faultwatch_dead_letters_total", ())] == 1
    stage.lines = 25  # read at scrape time
    assert samples(m.registry)[("faultwatch_lines_total", ())] == 25


def test_agent_metrics_read_the_stats_at_scrape_time() -> None:
    stats = {"lines_read": 5, "lines_acked": 4, "spool_depth": 1, "drops": 0,
             "ack_lag_s": 0.5, "broker_up": True}
    alive = [True]
    reg = agent_registry(lambda: stats, lambda: alive[0], {"job_name": "j", "node": "n1"})
    lab = (("job_name", "j"), ("node", "n1"))
    assert samples(reg)[("faultwatch_agent_lines_read_total", lab)] == 5
    stats["lines_read"] = 9
    alive[0] = False
    s = samples(reg)
    assert s[("faultwatch_agent_lines_read_total", lab)] == 9
    assert s[("faultwatch_agent_child_alive", lab)] == 0
    assert s[("faultwatch_agent_broker_up", lab)] == 1
    assert s[("faultwatch_agent_ack_lag_seconds", lab)] == 0.5
