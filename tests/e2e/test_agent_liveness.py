"""What keeps a job alive, and rank mode, through real agents and a real processor on Kafka.

A tqdm bar (carriage returns, no newline) is output; an SDK stage carries its own window;
rank mode (`torchrun --no-python faultwatch agent ... -- python train.py`) ships each rank as
its own instance. Each case has a control that must decide, so the tests can fail.
"""

from __future__ import annotations

import json
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.cluster import (
    agent_cmd,
    decisions,
    processor,
    wait_decisions,
    wait_processed,
    wait_processor_ready,
)
from tests.support.processes import TRAIN, faultwatch_exe, job_env

pytestmark = [pytest.mark.slow, pytest.mark.kafka]

WINDOW_S = 3.0

TQDM = """
import sys, time
for i in range(30):
    sys.stdout.write(f"\\rtraining {i}/30 [{'#' * (i // 3):<10}]")
    sys.stdout.flush()
    time.sleep(0.3)
sys.stdout.write("\\n")
print("done", flush=True)
"""

# Steps, then a silent phase 3x the job's hang window: inside an SDK stage with its own
# window (no hang) or bare (a hang). argv[1] selects.
STAGE = """
import sys, time
from faultwatch import sdk
for step in range(5):
    print(f"step {step} loss 0.5", flush=True)
    sdk.progress(step)
    time.sleep(0.2)
if sys.argv[1] == "stage":
    with sdk.stage("checkpoint", hang_window_s=60):
        time.sleep(9)
else:
    time.sleep(9)
print("step 5 loss 0.4", flush=True)
"""


@pytest.fixture(scope="module")
def cluster(kafka_bootstrap: str,
            tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, str]]:
    prefix = f"live{uuid.uuid4().hex[:8]}."
    log = tmp_path_factory.mktemp("liveproc") / "processor.log"
    with processor(kafka_bootstrap, prefix, log, "--hang-window-s", str(WINDOW_S),
                   "--settle-s", "1") as proc:
        wait_processor_ready(kafka_bootstrap, prefix, proc, log)
        yield kafka_bootstrap, prefix
        assert proc.poll() is None, f"processor died:\n{log.read_text()[-4000:]}"


def run(cluster: tuple[str, str], job: str, cmd: list[str], tmp: Path,
        timeout: float = 60) -> subprocess.CompletedProcess[bytes]:
    bootstrap, prefix = cluster
    return subprocess.run(agent_cmd(bootstrap, prefix, job, "node-0", cmd,
                                    "--spool-dir", str(tmp / job)),
                          env=job_env(), capture_output=True, timeout=timeout)


def test_tqdm_bar_keeps_a_job_alive(cluster: tuple[str, str], tmp_path: Path) -> None:
    job = f"tqdm-{uuid.uuid4().hex[:6]}"
    proc = run(cluster, job, [sys.executable, "-c", TQDM], tmp_path)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert b"\rtraining 29/30" in proc.stdout  # copied unchanged, carriage returns included
    wait_processed(*cluster)  # positive control: the processor read the whole job
    assert decisions(*cluster, job) == []  # 9 s of \r updates, window 3 s: never silent


def test_sdk_stage_window_reaches_the_processor(cluster: tuple[str, str],
                                                tmp_path: Path) -> None:
    staged, bare = f"stage-{uuid.uuid4().hex[:6]}", f"bare-{uuid.uuid4().hex[:6]}"
    proc = run(cluster, staged, [sys.executable, "-c", STAGE, "stage"], tmp_path)
    assert proc.returncode == 0, proc.stderr[-2000:]
    control = subprocess.Popen(
        agent_cmd(*cluster, bare, "node-0", [sys.executable, "-c", STAGE, "bare"],
                  "--spool-dir", str(tmp_path / bare)),
        env=job_env(), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        hung = wait_decisions(*cluster, bare, timeout_s=30)
    finally:
        control.kill()
        control.wait(10)
    assert [d["reason"]["kind"] for d in hung] == ["hang"], hung
    wait_processed(*cluster)  # the staged job's records are all processed too
    assert decisions(*cluster, staged) == []


def test_rank_mode_under_torchrun(cluster: tuple[str, str], tmp_path: Path) -> None:
    bootstrap, prefix = cluster
    job = f"rankmode-{uuid.uuid4().hex[:6]}"
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone",
           "--nproc-per-node=2", "--no-python", faultwatch_exe(), "agent",
           "--bootstrap", bootstrap, "--topic-prefix", prefix, "--job", job,
           "--heartbeat-s", "1", "--spool-dir", str(tmp_path / "spool"),
           "--", sys.executable, str(TRAIN)]
    proc = subprocess.run(cmd, env=job_env(FW_FAULT="retryable"), capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode != 0  # rank 1 raised; torchrun failed the group
    decs = wait_decisions(bootstrap, prefix, job)
    assert [d["action"] for d in decs] == ["restart"], decs
    first = decs[0]["evidence"]["first_error"]
    assert first["rank"] == 1 and "ConnectionError" in first["line"], first
    assert first["node"].endswith("-rank1")  # each rank's agent is its own instance
    out = subprocess.run([faultwatch_exe(), "logs", job, "--bootstrap", bootstrap,
                          "--topic-prefix", prefix, "--json"], capture_output=True, text=True,
                         timeout=60)
    lines = [json.loads(x) for x in out.stdout.splitlines()]
    ranks = {ln["rank"] for ln in lines if ln["text"].startswith("step 0 ")}
    assert ranks == {0, 1}, lines[:10]
