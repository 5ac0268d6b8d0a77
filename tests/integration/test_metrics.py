"""A real Prometheus scrapes a real processor and agent; PromQL returns the expected numbers."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import urllib.parse
import urllib.request
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from faultwatch.kafka import broker as kafka_broker
from tests.support.waiting import wait_until

pytestmark = [pytest.mark.kafka, pytest.mark.slow]

LINES = 50
# Prints LINES lines, then stays alive (so `child_alive` is 1 while Prometheus scrapes).
CHILD = (f"import time\nfor i in range({LINES}): print('step', i, flush=True)\n"
         "while True: time.sleep(0.1)\n")


class Prometheus:
    def __init__(self, tmp: Path, targets: dict[str, int]):
        exe = shutil.which("prometheus")
        assert exe, "Debian's `prometheus` package is needed (scripts/bootstrap.sh installs it)"
        self.port = kafka_broker.free_port()
        scrape = [{"job_name": name, "scrape_interval": "1s",
                   "static_configs": [{"targets": [f"{kafka_broker.HOST}:{port}"]}]}
                  for name, port in targets.items()]
        cfg = tmp / "prometheus.yml"
        cfg.write_text(json.dumps({"global": {"scrape_interval": "1s"},
                                   "scrape_configs": scrape}))  # JSON is YAML
        self.log = open(tmp / "prometheus.log", "wb")  # noqa: SIM115
        self.proc = subprocess.Popen(
            [exe, f"--config.file={cfg}", f"--storage.tsdb.path={tmp / 'tsdb'}",
             f"--web.listen-address={kafka_broker.HOST}:{self.port}"],
            stdout=self.log, stderr=subprocess.STDOUT)

    def query(self, promql: str) -> list[dict[str, Any]]:
        url = (f"http://{kafka_broker.HOST}:{self.port}/api/v1/query?"
               + urllib.parse.urlencode({"query": promql}))
        with urllib.request.urlopen(url, timeout=5) as resp:  # noqa: S310
            body = json.loads(resp.read())
        assert body["status"] == "success", body
        result: list[dict[str, Any]] = body["data"]["result"]
        return result

    def value(self, promql: str) -> float | None:
        try:
            result = self.query(promql)
        except OSError:
            return None
        return float(result[0]["value"][1]) if result else None

    def wait_value(self, promql: str, want: float, timeout_s: float = 90,
                   at_least: bool = False) -> float:
        def value() -> float | None:
            assert self.proc.poll() is None, "prometheus exited"
            return self.value(promql)

        got = wait_until(value, timeout_s, f"{promql} {'>=' if at_least else '=='} {want}",
                         interval_s=0.5, until=lambda got: got is not None and (
                             got >= want if at_least else got == want))
        assert got is not None
        return got

    def stop(self) -> None:
        self.proc.terminate()
        self.proc.wait(timeout=30)
        self.log.close()


@pytest.fixture
def processes() -> Iterator[list[subprocess.Popen[bytes]]]:
    procs: list[subprocess.Popen[bytes]] = []
    yield procs
    for p in procs:
        if p.poll() is None:
            p.terminate()
    for p in procs:
        try:
            p.wait(timeout=30)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()


def test_prometheus_scrapes_processor_and_agent(
        kafka_bootstrap: str, topic_prefix: str, tmp_path: Path,
        processes: list[subprocess.Popen[bytes]]) -> None:
    job = f"metrics-{uuid.uuid4().hex[:6]}"
    pport, aport = kafka_broker.free_port(), kafka_broker.free_port()
    env = {**os.environ, "FAULTWATCH_BOOTSTRAP": kafka_bootstrap}
    fw = [sys.executable, "-m", "faultwatch"]
    processes.append(subprocess.Popen(
        [*fw, "process", "--topic-prefix", topic_prefix, "--metrics-port", str(pport),
         "--app-id", f"fw-{topic_prefix}"], env=env, stdout=subprocess.DEVNULL,
        stderr=open(tmp_path / "process.log", "wb")))  # noqa: SIM115
    processes.append(subprocess.Popen(
        [*fw, "agent", "--job", job, "--node", "n1", "--topic-prefix", topic_prefix,
         "--spool-dir", str(tmp_path / "spool"), "--heartbeat-s", "0.5",
         "--metrics-port", str(aport), "--", sys.executable, "-c", CHILD],
        env=env, stdout=subprocess.DEVNULL,
        stderr=open(tmp_path / "agent.log", "wb")))  # noqa: SIM115
    prom = Prometheus(tmp_path, {"faultwatch-processor": pport, "faultwatch-agent": aport})
    try:
        sel = f'{{job_name="{job}",node="n1"}}'
        prom.wait_value(f"faultwatch_agent_lines_read_total{sel}", LINES)
        prom.wait_value(f"faultwatch_agent_lines_acked_total{sel}", LINES)
        prom.wait_value(f"faultwatch_agent_child_alive{sel}", 1)
        prom.wait_value(f"faultwatch_agent_spool_depth{sel}", 0)
        prom.wait_value('up{job="faultwatch-processor"}', 1, timeout_s=120)
        prom.wait_value("sum(faultwatch_lines_total)", LINES, timeout_s=120)
        # a crash: the processor decides, and counts the decision by kind and action
        crash = subprocess.run(
            [*fw, "agent", "--job", f"{job}-crash", "--node", "n1", "--topic-prefix",
             topic_prefix, "--spool-dir", str(tmp_path / "spool2"), "--no-follow-decisions",
             "--", sys.executable, "-c", "import sys; sys.exit(3)"],
            env=env, capture_output=True, timeout=120)
        assert crash.returncode == 77, crash.stderr.decode()[-2000:]  # undecided (no follow)
        prom.wait_value('sum(faultwatch_decisions_total{kind="exit"})', 1, timeout_s=120,
                        at_least=True)
        prom.wait_value("sum(faultwatch_lines_total)", LINES)  # the crash printed nothing
        assert (prom.value('sum(faultwatch_records_total{stage="job"})') or 0) > 0
        assert prom.value("sum(faultwatch_dead_letters_total)") in (None, 0.0)
        assert prom.value("faultwatch_jobs_tracked") is not None
    finally:
        prom.stop()
        for name in ("process.log", "agent.log", "prometheus.log"):
            print(f"--- {name}\n" + (tmp_path / name).read_text(errors="replace")[-3000:])
