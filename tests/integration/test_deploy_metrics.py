"""deploy/'s Prometheus and Grafana files against what the code really exports: a real
`faultwatch process` (which has made a real decision) and two real agents on one host, all on
`--metrics-port 0` with `--metrics-address-file`; a real Prometheus runs
deploy/prometheus/prometheus.yml (its file_sd finds the agents from their address files) with
deploy's alert rules. Every metric and label that the alert rules, their promtool unit tests,
the Grafana dashboard and docs/operating.md name must be in the scraped /metrics output (a
hand-kept list would drift with the code)."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import urllib.parse
import urllib.request
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import promql_parser
import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

from faultwatch import __version__
from faultwatch.kafka import broker as kafka_broker
from tests.support.waiting import wait_until

pytestmark = [pytest.mark.kafka, pytest.mark.slow]

REPO = Path(__file__).resolve().parents[2]
DEPLOY = REPO / "deploy"
PROM_DIR = DEPLOY / "prometheus"
FW = [sys.executable, "-m", "faultwatch"]
# labels Prometheus itself puts on every series of a target, and its own series
TARGET_LABELS = {"job", "instance"}
PROMETHEUS_OWN = {"up", "scrape_duration_seconds", "scrape_samples_scraped", "ALERTS"}
LINES = 50
# Prints LINES step lines over about a second (steps printed in one burst can share one
# timestamp: no productive time between them, a goodput of exactly 0), then stays alive (so
# `child_alive` is 1 while Prometheus scrapes).
CHILD = (f"import time\nfor i in range({LINES}):\n    print('step', i, flush=True)\n"
         "    time.sleep(0.02)\nwhile True: time.sleep(0.2)\n")
# Grafana's variables, as Grafana fills them in before Prometheus sees the query
GRAFANA_VARS = {"$__rate_interval": "1m", "$__interval": "15s", "$__range": "1h"}


@dataclass
class Exported:
    """What /metrics endpoints really serve: series name -> label names seen (None: the
    family has no sample yet, so its labels are unknown)."""

    labels: dict[str, set[str] | None] = field(default_factory=dict)

    def add(self, text: str) -> None:
        for fam in text_string_to_metric_families(text):
            for s in fam.samples:
                self.labels.setdefault(s.name, set())
                seen = self.labels[s.name]
                assert seen is not None
                seen |= set(s.labels)
            if not fam.samples:  # declared, no child yet: the names its type implies
                for suffix in SUFFIXES.get(fam.type, ("",)):
                    self.labels.setdefault(fam.name + suffix, None)


SUFFIXES = {"counter": ("_total", "_created"), "histogram": ("_bucket", "_count", "_sum"),
            "summary": ("_count", "_sum")}


class Prometheus:
    """A real Prometheus on deploy/prometheus/prometheus.yml, with its targets pointed here."""

    def __init__(self, tmp: Path, processor: str, sd_dir: Path):
        exe = shutil.which("prometheus")
        assert exe, "Debian's `prometheus` package is needed (scripts/bootstrap.sh installs it)"
        cfg = yaml.safe_load((PROM_DIR / "prometheus.yml").read_text())
        cfg["global"] = {"scrape_interval": "1s", "evaluation_interval": "1s"}
        cfg["rule_files"] = [str(PROM_DIR / f) for f in cfg["rule_files"]]
        jobs = {j["job_name"]: j for j in cfg["scrape_configs"]}
        jobs["faultwatch-processor"]["static_configs"] = [{"targets": [processor]}]
        (sd,) = jobs["faultwatch-agent"]["file_sd_configs"]
        assert sd["files"][0].endswith("/*.json"), sd  # where agents' address files go
        sd["files"] = [str(sd_dir / "*.json")]
        sd["refresh_interval"] = "1s"
        (tmp / "prometheus.yml").write_text(json.dumps(cfg))  # JSON is YAML
        self.port = kafka_broker.free_port()
        self.log = tmp / "prometheus.log"
        with open(self.log, "wb") as fh:
            self.proc = subprocess.Popen(
                [exe, f"--config.file={tmp / 'prometheus.yml'}",
                 f"--storage.tsdb.path={tmp / 'tsdb'}",
                 f"--web.listen-address=127.0.0.1:{self.port}"],
                stdout=fh, stderr=subprocess.STDOUT)

    def api(self, path: str, **params: str) -> Any:
        url = f"http://127.0.0.1:{self.port}/api/v1/{path}?" + urllib.parse.urlencode(params)
        try:
            with urllib.request.urlopen(url, timeout=10) as resp:  # noqa: S310
                return json.loads(resp.read())
        except urllib.error.HTTPError as e:  # a bad query: 400 with the error in the body
            return json.loads(e.read())

    def value(self, promql: str) -> float | None:
        assert self.proc.poll() is None, self.log.read_text()[-3000:]
        try:
            body = self.api("query", query=promql)
        except OSError:
            return None
        result = body.get("data", {}).get("result") or []
        return float(result[0]["value"][1]) if result else None

    def stop(self) -> None:
        self.proc.terminate()
        self.proc.wait(timeout=30)


@dataclass
class Stack:
    tmp: Path
    sd_dir: Path
    processor: str
    agents: list[tuple[subprocess.Popen[bytes], Path]]
    prom: Prometheus
    exported: Exported
    scraped: dict[str, str]  # "processor" / "agent" -> one /metrics text


def scrape(target: str) -> str | None:
    try:
        with urllib.request.urlopen(f"http://{target}/metrics", timeout=5) as r:  # noqa: S310
            return bytes(r.read()).decode()
    except OSError:
        return None


def target_of(address_file: Path) -> str | None:
    try:
        (entry,) = json.loads(address_file.read_text())
    except (OSError, ValueError):
        return None
    (target,) = entry["targets"]
    return str(target)


@pytest.fixture(scope="module")
def stack(kafka_bootstrap: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    tmp = tmp_path_factory.mktemp("deploy-metrics")
    prefix = f"dm{uuid.uuid4().hex[:8]}."
    env = {**os.environ, "FAULTWATCH_BOOTSTRAP": kafka_bootstrap,
           "FAULTWATCH_TOPIC_PREFIX": prefix}
    procs: list[subprocess.Popen[bytes]] = []

    def start(name: str, *argv: str) -> subprocess.Popen[bytes]:
        with open(tmp / f"{name}.log", "wb") as log:
            p = subprocess.Popen([*FW, *argv], env=env, stdout=subprocess.DEVNULL, stderr=log,
                                 start_new_session=True)
        procs.append(p)
        return p

    sd_dir = tmp / "sd"
    job = f"dm-{uuid.uuid4().hex[:6]}"
    prom = None
    try:
        start("processor", "process", "--app-id", f"fw-{prefix}", "--metrics-port", "0",
              "--metrics-address-file", str(tmp / "processor-{pid}.json"))
        agents = []
        for rank in (0, 1):  # two agents of one job on one host: port 0 each
            p = start(f"agent{rank}", "agent", "--job", job, "--node", "gpu1", "--rank",
                      str(rank), "--spool-dir", str(tmp / "spool"), "--heartbeat-s", "0.5",
                      "--no-follow-decisions", "--metrics-port", "0", "--metrics-address-file",
                      str(sd_dir / "{job}-{node}-{pid}.json"), "--", sys.executable, "-c",
                      CHILD)
            agents.append((p, sd_dir / f"{job}-gpu1-{p.pid}.json"))
        processor_file = tmp / f"processor-{procs[0].pid}.json"
        wait_until(lambda: target_of(processor_file), 120, "the processor's address file")
        processor = target_of(processor_file)
        assert processor is not None
        for p, f in agents:
            wait_until(lambda f=f: target_of(f), 60, f"agent {p.pid}'s address file")
        prom = Prometheus(tmp, processor, sd_dir)
        # a crash: the processor decides (decisions and latency get their labelled samples)
        crash = subprocess.run(
            [*FW, "agent", "--job", f"{job}-crash", "--node", "n1", "--spool-dir",
             str(tmp / "spool-crash"), "--no-follow-decisions", "--", sys.executable, "-c",
             "import sys; sys.exit(3)"], env=env, capture_output=True, timeout=120)
        assert crash.returncode == 77, crash.stderr.decode()[-2000:]  # undecided (no follow)
        wait_until(lambda: "faultwatch_decisions_total{" in (scrape(processor) or ""), 120,
                   "the crash's decision to be counted")
        wait_until(lambda: "faultwatch_consumer_lag{" in (scrape(processor) or ""), 60,
                   "the consumer lag to be reported")
        # the agents' job prints steps: its run ledger is published with a goodput ratio
        wait_until(lambda: "faultwatch_job_goodput_ratio{" in (scrape(processor) or ""), 60,
                   "the running job's goodput to be published")
        exported = Exported()
        scraped = {"processor": scrape(processor) or ""}
        exported.add(scraped["processor"])
        for _, f in agents:
            text = scrape(target_of(f) or "")
            assert text, f
            scraped["agent"] = text
            exported.add(text)
        yield Stack(tmp, sd_dir, processor, agents, prom, exported, scraped)
    finally:
        if prom is not None:
            prom.stop()
        for p in procs:
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGTERM)
        for p in procs:
            try:
                p.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait()
        for log in sorted(tmp.glob("*.log")):
            print(f"--- {log.name}\n" + log.read_text(errors="replace")[-2000:])
        # the processor, stopped by SIGTERM, removed its address file too (at exit)
        assert not list(tmp.glob("processor-*.json")), "the processor's address file stayed"


# ---- PromQL: which series and labels an expression names -------------------------------------

def _walk(node: Any) -> Iterator[Any]:
    yield node
    for attr in ("expr", "lhs", "rhs", "param", "vector_selector"):
        child = getattr(node, attr, None)
        if isinstance(child, promql_parser.Expr):
            yield from _walk(child)
    for arg in getattr(node, "args", None) or []:
        yield from _walk(arg)


def problems_of(expr: str, exported: Exported, where: str) -> list[str]:
    """What `expr` names that no real endpoint exports: series, matcher labels, `by` labels."""
    try:
        tree = promql_parser.parse(expr)
    except ValueError as e:
        return [f"{where}: does not parse: {e}"]
    out = []
    for node in _walk(tree):
        if isinstance(node, promql_parser.VectorSelector):
            name = node.name
            if name in PROMETHEUS_OWN:
                continue
            if name not in exported.labels:
                out.append(f"{where}: {name} is not exported")
                continue
            known = exported.labels[name]
            used = {m.name for m in node.matchers.matchers} - TARGET_LABELS
            if used and known is None:
                out.append(f"{where}: {name} has no sample, so its labels {used} are unchecked")
            elif used - (known or set()):
                out.append(f"{where}: {name} has no label {sorted(used - (known or set()))}")
        elif isinstance(node, promql_parser.AggregateExpr) and node.modifier is not None \
                and node.modifier.type == promql_parser.AggModifierType.By:
            inner: set[str] = set(TARGET_LABELS)
            for sub in _walk(node.expr):
                if isinstance(sub, promql_parser.VectorSelector):
                    inner |= exported.labels.get(sub.name) or set()
                elif isinstance(sub, promql_parser.AggregateExpr) and sub.modifier:
                    inner |= set(sub.modifier.labels)
            missing = set(node.modifier.labels) - inner
            if missing:
                out.append(f"{where}: `by ({', '.join(sorted(missing))})` groups by labels the "
                           f"series do not carry")
    return out


def alert_rules() -> list[tuple[str, str]]:
    out = []
    for path in sorted(PROM_DIR.glob("*-alerts.yml")):
        for group in yaml.safe_load(path.read_text())["groups"]:
            for rule in group["rules"]:
                out.append((f"{path.name}: {rule.get('alert') or rule.get('record')}",
                            rule["expr"]))
    assert len(out) >= 8, out
    return out


def dashboard_queries() -> list[tuple[str, str]]:
    out = []
    for path in sorted((DEPLOY / "grafana").glob("*.json")):
        dash = json.loads(path.read_text())
        for panel in [p for top in dash["panels"] for p in (top, *top.get("panels", []))]:
            for t in panel.get("targets", []):
                expr = t["expr"]
                for var, value in GRAFANA_VARS.items():
                    expr = expr.replace(var, value)
                assert "$" not in expr, f"{panel['title']}: a variable this test does not know"
                out.append((f"{path.name}: {panel['title']} {t['refId']}", expr))
    assert len(out) >= 10, out
    return out


# ---- the tests -------------------------------------------------------------------------------

def test_alert_rules_name_only_what_the_code_exports(stack: Stack) -> None:
    problems = [p for where, expr in alert_rules()
                for p in problems_of(expr, stack.exported, where)]
    assert not problems, "\n".join(problems)
    # the real Prometheus loaded the same rules and evaluates them without error
    def healthy() -> bool:
        groups = stack.prom.api("rules").get("data", {}).get("groups", [])
        rules = [r for g in groups for r in g["rules"]]
        return len(rules) == len(alert_rules()) and all(r["health"] == "ok" for r in rules)
    wait_until(healthy, 60, "Prometheus to evaluate every rule without error")


def test_the_name_check_can_fail(stack: Stack) -> None:
    """Positive control of the checks above: a misspelt series, a label the series lacks, a
    grouping label nobody sets, and a series that only Prometheus makes."""
    e = stack.exported
    assert problems_of("faultwatch_decision_total > 0", e, "x")
    assert problems_of('faultwatch_decisions_total{stage="job"} > 0', e, "x")
    assert problems_of("sum by (stage) (faultwatch_dead_letters_total)", e, "x")
    assert not problems_of('sum by (action) (faultwatch_decisions_total{kind="exit"})', e, "x")
    assert not problems_of('up{job="faultwatch-agent"} == 0', e, "x")


def test_promtool_unit_tests_feed_only_series_the_code_exports(stack: Stack) -> None:
    problems = []
    for path in sorted(PROM_DIR.glob("*-alerts.test.yml")):
        for case in yaml.safe_load(path.read_text())["tests"]:
            for series in case["input_series"]:
                problems += problems_of(series["series"], stack.exported,
                                        f"{path.name}: {case['name']}")
    assert not problems, "\n".join(problems)


def test_dashboard_queries_name_only_what_the_code_exports(stack: Stack) -> None:
    queries = dashboard_queries()
    problems = [p for where, expr in queries for p in problems_of(expr, stack.exported, where)]
    assert not problems, "\n".join(problems)
    # and the real Prometheus runs each one (Prometheus's own parser, not only ours)
    wait_until(lambda: stack.prom.value('sum(up{job="faultwatch-processor"})') == 1, 60,
               "Prometheus to scrape the processor")
    for where, expr in queries:
        body = stack.prom.api("query", query=expr)
        assert body["status"] == "success", (where, body)
    # panels show data from the real processes (a query naming nothing would show nothing)
    assert stack.prom.value('count(faultwatch_build_info{component="agent"})') == 2
    wait_until(lambda: (stack.prom.value("sum(faultwatch_decisions_total)") or 0) >= 1, 60,
               "the decision on the dashboard")


def test_prometheus_reads_the_numbers_the_processes_count(stack: Stack) -> None:
    """PromQL over the real scrapes: each agent read and shipped its child's lines, the
    processor matched all of them and counted the crash's decision by kind."""
    prom = stack.prom
    for _, f in stack.agents:
        sel = f'{{job="faultwatch-agent", instance="{target_of(f)}"}}'
        for name, want in ((f"faultwatch_agent_lines_read_total{sel}", LINES),
                           (f"faultwatch_agent_lines_acked_total{sel}", LINES),
                           (f"faultwatch_agent_child_alive{sel}", 1),
                           (f"faultwatch_agent_spool_depth{sel}", 0),
                           (f"faultwatch_agent_broker_up{sel}", 1)):
            wait_until(lambda n=name: prom.value(n), 90, name,
                       until=lambda v, w=want: v == w)
    wait_until(lambda: prom.value("sum(faultwatch_lines_total)"), 120,
               "the processor to match every line", until=lambda v: v == 2 * LINES)
    wait_until(lambda: prom.value('sum(faultwatch_decisions_total{kind="exit"})'), 60,
               "the crash's decision", until=lambda v: (v or 0) >= 1)
    assert (prom.value('sum(faultwatch_records_total{stage="job"})') or 0) > 0
    assert prom.value("sum(faultwatch_dead_letters_total)") in (None, 0.0)
    assert prom.value("faultwatch_jobs_tracked") is not None


def test_goodput_series_of_a_real_run_reach_prometheus(stack: Stack) -> None:
    """The agents' job (50 step lines, then alive): the processor published its run ledger,
    and Prometheus reads its goodput ratio by job_name, the badput counters by cause and the
    recovery histogram (docs/goodput.md); the crash job made no progress: no ratio."""
    prom = stack.prom
    job = stack.agents[0][1].name.split("-gpu1-")[0]
    ratio = wait_until(lambda: prom.value(
        f'max(faultwatch_job_goodput_ratio{{job_name="{job}"}})'), 90,
        "the running job's goodput in Prometheus", until=lambda v: v is not None)
    assert ratio is not None and 0 < ratio <= 1, ratio
    assert prom.value(f'count(faultwatch_job_goodput_ratio{{job_name="{job}-crash"}})') is None
    causes = wait_until(lambda: prom.value("count(faultwatch_badput_seconds_total)"), 60,
                        "the badput counters", until=lambda v: v is not None)
    assert causes == 9  # one series per cause
    assert prom.value("sum(faultwatch_incident_recovery_seconds_count)") is not None
    assert prom.value("max(faultwatch_lemon_nodes)") == 0


def test_build_info_and_process_metrics_on_both_endpoints(stack: Stack) -> None:
    for component, text in stack.scraped.items():
        families = {f.name: f for f in text_string_to_metric_families(text)}
        (info,) = families["faultwatch_build_info"].samples
        assert info.labels["component"] == component and info.labels["version"] == __version__
        assert info.value == 1
        for name in ("process_cpu_seconds", "process_resident_memory_bytes",
                     "process_start_time_seconds"):
            (s,) = families[name].samples
            assert s.value > 0, (component, name)
    agent = {f.name: f for f in text_string_to_metric_families(stack.scraped["agent"])}
    assert agent["faultwatch_build_info"].samples[0].labels["node"] == "gpu1"


def test_docs_name_only_exported_metrics(stack: Stack) -> None:
    text = (REPO / "docs" / "operating.md").read_text()
    section = text[text.index("## 5. Metrics"):text.index("## 5a.")]
    named = set(re.findall(r"`((?:faultwatch|process)_\w+)", section))
    assert len(named) >= 20, named
    def series(name: str) -> str | None:  # a histogram is named by its family
        return next((n for n in (name, f"{name}_bucket") if n in stack.exported.labels), None)
    missing = sorted(n for n in named if series(n) is None)
    assert not missing, f"docs/operating.md names metrics nothing exports: {missing}"
    wrong = []
    for name, labels in re.findall(r"`(faultwatch_\w+)\{([\w,]+)\}`", section):
        known = stack.exported.labels[series(name) or name]
        if known is not None and not set(labels.split(",")) <= known:  # None: no sample yet
            wrong.append(f"{name}{{{labels}}}: exported with {known}")
    assert not wrong, "docs/operating.md names labels the metrics do not carry:\n" + \
        "\n".join(wrong)


def test_prometheus_finds_two_agents_of_one_host_through_their_address_files(
        stack: Stack, kafka_bootstrap: str) -> None:
    """Two agents on one host, `--metrics-port 0`: each takes its own free port and says so
    in its address file; the deploy config's file_sd finds both; an agent that exits removes
    its file and Prometheus drops it, the other stays (positive control). A fixed port that is
    taken does not stop a third agent's training command."""
    (a, fa), (b, fb) = stack.agents
    ta, tb = target_of(fa), target_of(fb)
    assert ta and tb and ta != tb, (ta, tb)
    assert ta.startswith("127.0.0.1:") and tb.startswith("127.0.0.1:")

    def agent_targets() -> dict[str, str]:
        active = stack.prom.api("targets").get("data", {}).get("activeTargets", [])
        return {t["labels"]["instance"]: t["health"] for t in active
                if t["labels"]["job"] == "faultwatch-agent"}
    wait_until(lambda: agent_targets() == {ta: "up", tb: "up"}, 60,
               "Prometheus to scrape both agents")
    sel = '{job="faultwatch-agent", job_name=~"dm-.*", node="gpu1"}'
    wait_until(lambda: stack.prom.value(f"count(faultwatch_agent_child_alive{sel} == 1)") == 2,
               60, "both children alive in Prometheus")

    taken = subprocess.run(
        [*FW, "agent", "--job", "dm-taken", "--node", "gpu1", "--spool-dir",
         str(stack.tmp / "spool-taken"), "--no-follow-decisions", "--metrics-port",
         ta.rsplit(":", 1)[1], "--", sys.executable, "-c", "print('trained')"],
        env={**os.environ, "FAULTWATCH_BOOTSTRAP": kafka_bootstrap,
             "FAULTWATCH_TOPIC_PREFIX": f"dm{uuid.uuid4().hex[:8]}."},
        capture_output=True, timeout=120)
    assert taken.returncode == 0, taken.stderr.decode()[-2000:]
    assert b"trained" in taken.stdout
    assert b"event=metrics_unavailable" in taken.stderr, taken.stderr.decode()[-2000:]

    os.killpg(b.pid, signal.SIGTERM)
    b.wait(timeout=60)
    assert not fb.exists(), "the address file outlived its agent"
    assert fa.exists()
    wait_until(lambda: agent_targets() == {ta: "up"}, 60, "Prometheus to drop the gone agent")
