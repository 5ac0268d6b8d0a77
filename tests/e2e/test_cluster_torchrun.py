"""Cluster mode end to end: agent -> Kafka -> processor (both stages) -> decisions topic."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from faultwatch.agents.exitcodes import EXIT_UNDECIDED
from tests.support.cluster import (
    agent_cmd,
    decisions,
    processor,
    wait_decisions,
    wait_processed,
    wait_processor_ready,
)
from tests.support.processes import faultwatch_exe, job_env, torchrun_cmd

pytestmark = [pytest.mark.slow, pytest.mark.kafka]

HANG_WINDOW_S = 5.0


@pytest.fixture(scope="module")
def cluster(kafka_bootstrap: str,
            tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, str]]:
    prefix = f"e2e{uuid.uuid4().hex[:8]}."
    log = tmp_path_factory.mktemp("proc") / "processor.log"
    with processor(kafka_bootstrap, prefix, log, "--hang-window-s", str(HANG_WINDOW_S),
                   "--settle-s", "1.5", "--max-restarts", "3") as proc:
        wait_processor_ready(kafka_bootstrap, prefix, proc, log)
        yield kafka_bootstrap, prefix
        assert proc.poll() is None, f"processor died:\n{log.read_text()[-4000:]}"


def run_agent(cluster: tuple[str, str], job: str, tmp_path: Path, timeout: float = 120,
              **fault: str) -> subprocess.CompletedProcess[str]:
    bootstrap, prefix = cluster
    cmd = agent_cmd(bootstrap, prefix, job, "node-0", torchrun_cmd(),
                    "--spool-dir", str(tmp_path / "spool"))
    return subprocess.run(cmd, env=job_env(**fault), capture_output=True, text=True,
                          timeout=timeout)


def test_retryable_error_on_rank1_one_restart(cluster: tuple[str, str], tmp_path: Path) -> None:
    job = f"retry-{uuid.uuid4().hex[:6]}"
    t0 = time.time()
    proc = run_agent(cluster, job, tmp_path, FW_FAULT="retryable")
    assert proc.returncode == EXIT_UNDECIDED, proc.stderr[-3000:]  # not following
    wait_decisions(*cluster, job)
    wait_processed(*cluster)  # every record of the job processed: nothing else may follow
    decs = decisions(*cluster, job)
    assert [(d["action"], d["reason"]["kind"]) for d in decs] == [("restart", "error")], decs
    first = decs[0]["evidence"]["first_error"]
    assert first["rank"] == 1 and "ConnectionError" in first["line"], first
    assert decs[0]["targets"]["ranks"] == [1]
    assert decs[0]["ts"] - t0 < 60


def test_fatal_error_one_fail(cluster: tuple[str, str], tmp_path: Path) -> None:
    job = f"fatal-{uuid.uuid4().hex[:6]}"
    proc = run_agent(cluster, job, tmp_path, FW_FAULT="fatal")
    assert proc.returncode == EXIT_UNDECIDED, proc.stderr[-3000:]  # not following
    wait_decisions(*cluster, job)
    wait_processed(*cluster)
    decs = decisions(*cluster, job)
    assert [d["action"] for d in decs] == ["fail"], decs
    first = decs[0]["evidence"]["first_error"]
    assert first["rank"] == 1 and "ModuleNotFoundError" in first["line"], first


def test_silent_rank_hang_decided_within_window(cluster: tuple[str, str],
                                                tmp_path: Path) -> None:
    bootstrap, prefix = cluster
    job = f"hang-{uuid.uuid4().hex[:6]}"
    cmd = agent_cmd(bootstrap, prefix, job, "node-0", torchrun_cmd(),
                    "--spool-dir", str(tmp_path / "spool"))
    agent = subprocess.Popen(cmd, env=job_env(FW_FAULT="hang"), stdout=subprocess.DEVNULL,
                             stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        decs = wait_decisions(bootstrap, prefix, job, timeout_s=90)
    finally:
        os.killpg(agent.pid, signal.SIGTERM)
        agent.wait(30)
    assert [(d["action"], d["reason"]["kind"]) for d in decs] == [("restart", "hang")], decs
    ev = decs[0]["evidence"]
    # the ranks are known (the agent's torchrun environment): the last lines are per rank,
    # none of `rank ?`, and `faultwatch logs` names the rank of every step line
    assert set(ev["last_lines"]) == {"0", "1"}, ev["last_lines"]
    logs = subprocess.run([faultwatch_exe(), "logs", job, "--bootstrap", bootstrap,
                           "--topic-prefix", prefix, "--json"], capture_output=True, text=True,
                          timeout=60, env=job_env())
    rows = [json.loads(x) for x in logs.stdout.splitlines()]
    steps = [r for r in rows if " loss " in r["text"]]
    assert steps and {r["rank"] for r in steps} == {0, 1}, logs.stdout[-3000:]
    detected_after = ev["silent_for_s"]
    assert HANG_WINDOW_S <= detected_after <= HANG_WINDOW_S + 3.0, ev
    # published within a few seconds of the heartbeat that proved the silence
    assert decs[0]["ts"] - (ev["silent_since"] + detected_after) < 5.0


def test_clean_run_no_decision(cluster: tuple[str, str], tmp_path: Path) -> None:
    job = f"clean-{uuid.uuid4().hex[:6]}"
    proc = run_agent(cluster, job, tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "rank 0 done" in proc.stdout  # the child's output is copied unchanged
    wait_processed(*cluster)  # positive control: the processor read the whole job ...
    time.sleep(HANG_WINDOW_S)  # ... and a hang window passed after its exit (the condition)
    wait_processed(*cluster)
    assert decisions(*cluster, job) == []
