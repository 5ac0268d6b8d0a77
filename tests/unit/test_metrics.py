"""Metric names, labels and values as Prometheus reads them (text exposition format)."""

from __future__ import annotations

import ast
import inspect
import json
import os
import textwrap
import urllib.request
from pathlib import Path

import pytest
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from faultwatch import __version__
from faultwatch import metrics as fw_metrics
from faultwatch.errors import ConfigError
from faultwatch.metrics import (
    ProcessorMetrics,
    address_file_path,
    agent_registry,
    bound_port,
    check_address_file,
    remove_address_file,
    scrape_target,
    serve,
    write_address_file,
)
from faultwatch.streams.counters import COUNTED, Metrics


def samples(registry: object) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    text = generate_latest(registry).decode()  # type: ignore[arg-type]
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for fam in text_string_to_metric_families(text) for s in fam.samples}


def test_processor_metrics_count_by_label_and_read_the_stage_counters() -> None:
    m = ProcessorMetrics()
    stage = Metrics(lines=10, signals=4, dead_letters=1, logs_event_lag_s=0.5)
    stage.count("jobs_refused", 3)
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
    assert s[("faultwatch_jobs_refused_total", ())] == 3
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


def test_both_registries_carry_build_info_and_the_process_collector() -> None:
    agent = samples(agent_registry(lambda: {}, lambda: True, {"job_name": "j", "node": "n1"}))
    proc = samples(ProcessorMetrics().registry)
    for s, component, extra in ((agent, "agent", {"job_name": "j", "node": "n1"}),
                                (proc, "processor", {})):
        (info,) = [k for k in s if k[0] == "faultwatch_build_info"]
        labels = dict(info[1])
        assert labels["component"] == component and labels["version"] == __version__
        assert extra.items() <= labels.items()
        assert s[("process_resident_memory_bytes", ())] > 0
        assert ("process_cpu_seconds_total", ()) in s


def test_port_zero_takes_a_free_port_and_a_taken_port_is_a_clear_error() -> None:
    reg = agent_registry(lambda: {}, lambda: True, {"job_name": "j", "node": "n1"})
    a, b = serve(0, reg), serve(0, reg)
    try:
        pa, pb = bound_port(a), bound_port(b)
        assert pa and pb and pa != pb
        with urllib.request.urlopen(f"http://127.0.0.1:{pa}/metrics", timeout=5) as r:
            assert b"faultwatch_agent_child_alive" in r.read()
        with pytest.raises(ConfigError, match=f"cannot listen on 127.0.0.1:{pa}"):
            serve(pa, reg)
        with pytest.raises(ConfigError, match="not a TCP port"):
            serve(-1, reg)
    finally:
        a.shutdown()
        b.shutdown()


def test_the_address_file_is_a_file_sd_list_with_its_placeholders_filled(
        tmp_path: Path) -> None:
    path = address_file_path(str(tmp_path / "sd" / "{job}-{node}-{pid}.json"),
                             job="llama", node="gpu1")
    assert path == tmp_path / "sd" / f"llama-gpu1-{os.getpid()}.json"
    write_address_file(path, scrape_target("127.0.0.1", 41234))
    assert json.loads(path.read_text()) == [{"targets": ["127.0.0.1:41234"], "labels": {}}]
    assert [p.name for p in path.parent.iterdir()] == [path.name]  # no temporary left over
    remove_address_file(path)
    remove_address_file(path)  # twice: no error
    assert not path.exists()
    with pytest.raises(ConfigError, match="placeholders"):
        address_file_path("/x/{rank}.json")
    with pytest.raises(ConfigError, match="placeholders"):
        check_address_file("/x/{rank}.json", 0)
    with pytest.raises(ConfigError, match="needs --metrics-port"):
        check_address_file("/x/{pid}.json", None)
    check_address_file("/x/{job}-{node}-{pid}.json", 0)
    check_address_file(None, None)
    assert scrape_target("::1", 9) == "[::1]:9"
    assert not scrape_target("0.0.0.0", 9).startswith("0.0.0.0")


def test_actuate_and_notify_serve_what_they_refused() -> None:
    from faultwatch.metrics import REFUSALS, service_registry

    key = ("node_record", "unsigned-test")
    REFUSALS[key] += 3
    try:
        fams = {f.name: f for f in text_string_to_metric_families(
            generate_latest(service_registry("actuate")).decode())}
        got = {(s.labels["what"], s.labels["reason"]): s.value
               for s in fams["faultwatch_refused"].samples}
        assert got[key] == 3
        info = fams["faultwatch_build_info"].samples[0].labels
        assert info["component"] == "actuate"
    finally:
        del REFUSALS[key]


def attribute_names_read_by_string(source: str) -> list[str]:
    """getattr(x, "name") calls and `.extra[...]`/`.extra.get(...)` reads: counters read by
    a name mypy cannot check."""
    out = []
    for n in ast.walk(ast.parse(source)):
        if isinstance(n, ast.Call) and isinstance(n.func, ast.Name) and n.func.id == "getattr" \
                and len(n.args) >= 2 and isinstance(n.args[1], ast.Constant):
            out.append(str(n.args[1].value))
        elif isinstance(n, ast.Attribute) and n.attr == "extra":
            out.append("extra")
    return out


def test_metrics_read_the_stage_counters_typed_not_by_name() -> None:
    """Issue 38 item 9: /metrics reads the processor's counters through StageCounters (a
    renamed counter fails mypy), never by an attribute-name string."""
    source = inspect.getsource(fw_metrics._StageCollector)
    assert "self._c" in source and attribute_names_read_by_string(textwrap.dedent(source)) == []
    planted = 'def f(c):\n    return getattr(c, "lines", 0) + c.extra.get("jobs_refused", 0)\n'
    assert attribute_names_read_by_string(planted) == ["lines", "extra"]
    assert set(COUNTED) >= {"jobs_refused", "jobs_expired", "lines_throttled",
                            "nodes_throttled"}
