"""faultwatch's node side installs beside the newest training stack and works from there.

A fresh virtualenv (uv; torch comes hard-linked from uv's cache) gets the newest torch,
transformers, accelerate and lightning plus faultwatch built from this checkout, without
extras. It must pass `uv pip check` and hold no Faust. A real training job then runs under
`faultwatch agent` from that env, shipping to the broker, while `faultwatch process` runs from
the test's own env (the processor's): the job's retryable error in attempt 0 reaches the
processor, whose restart decision reaches the agent, which relaunches; attempt 1 finishes.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

from tests.support.cluster import decisions, processor

pytestmark = [pytest.mark.slow, pytest.mark.kafka]

REPO = Path(__file__).resolve().parents[2]
JOB = Path(__file__).resolve().parent / "jobs" / "train_hf_lightning.py"
TRAINING_STACK = ("torch", "transformers", "accelerate", "lightning")


def _uv() -> list[str]:
    """uv from the test env (it is in the `test` extra)."""
    beside = Path(sys.executable).parent / "uv"
    if beside.exists():
        return [str(beside)]
    found = shutil.which("uv")
    return [found] if found else [sys.executable, "-m", "uv"]


def _clean_env(**extra: str) -> dict[str, str]:
    """The environment of a process in the training env: nothing of the test env leaks in."""
    env = {k: v for k, v in os.environ.items()
           if k not in ("PYTHONPATH", "VIRTUAL_ENV", "PYTHONHOME")}
    env.update(UV_LINK_MODE="hardlink", UV_PYTHON_DOWNLOADS="never", HF_HUB_OFFLINE="1",
               OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1", PYTHONWARNINGS="ignore", **extra)
    return env


def _run(argv: list[str], timeout: float, **kw: object) -> subprocess.CompletedProcess[str]:
    out = subprocess.run(argv, capture_output=True, text=True, timeout=timeout,
                         env=_clean_env(), **kw)  # type: ignore[call-overload]
    assert out.returncode == 0, f"{argv}:\n{out.stdout[-2000:]}\n{out.stderr[-4000:]}"
    return out


@pytest.fixture(scope="module")
def train_env(tmp_path_factory: pytest.TempPathFactory) -> Path:
    venv = tmp_path_factory.mktemp("training-image") / "venv"
    _run([*_uv(), "venv", "-q", "--python", sys.executable, str(venv)], timeout=120)
    _run([*_uv(), "pip", "install", "-q", "--python", str(venv / "bin" / "python"), str(REPO),
          *TRAINING_STACK], timeout=1800)
    return venv


def test_the_training_image_is_consistent_and_has_no_faust(train_env: Path) -> None:
    py = str(train_env / "bin" / "python")
    _run([*_uv(), "pip", "check", "--python", py], timeout=120)
    probe = _run([py, "-c", (
        "import importlib.metadata as m, importlib.util as u, faultwatch.cli, faultwatch.sdk\n"
        "import faultwatch.integrations.huggingface, faultwatch.integrations.lightning\n"
        "print(u.find_spec('faust') is None)\n"
        "print(*(m.version(p) for p in ('faultwatch', 'torch', 'transformers', 'accelerate',"
        " 'lightning', 'click')))\n")], timeout=120)
    no_faust, versions = probe.stdout.splitlines()[-2:]
    assert no_faust == "True", probe.stdout
    assert versions.split()[0] == "0.1.0", versions
    print("training image (faultwatch torch transformers accelerate lightning click):",
          versions)


def test_a_training_job_under_the_agent_from_the_training_image(
        train_env: Path, kafka_bootstrap: str, tmp_path: Path) -> None:
    prefix = f"coinst{uuid.uuid4().hex[:8]}."
    job = f"hf-{uuid.uuid4().hex[:6]}"
    agent = [str(train_env / "bin" / "faultwatch"), "agent", "--bootstrap", kafka_bootstrap,
             "--topic-prefix", prefix, "--job", job, "--node", "node-0", "--heartbeat-s", "1",
             "--follow-decisions", "--decision-wait-s", "180",
             "--spool-dir", str(tmp_path / "spool"),
             "--", str(train_env / "bin" / "python"), str(JOB)]
    # the processor from this env (it has the processor extra), started without waiting: it
    # reads the logs topic from the earliest offset, and the agent waits for the decision
    with processor(kafka_bootstrap, prefix, tmp_path / "processor.log", "--settle-s", "1",
                   "--hang-window-s", "300", "--max-restarts", "2") as proc:
        run = subprocess.run(agent, capture_output=True, text=True, timeout=600,
                             env=_clean_env(FW_FAIL_ATTEMPTS="0"))
        assert proc.poll() is None, (tmp_path / "processor.log").read_text()[-3000:]
    out = run.stdout + run.stderr
    assert run.returncode == 0, out[-5000:]
    assert "ConnectionError: [Errno 104]" in run.stderr  # attempt 0 really failed ...
    assert "trained attempt 1: torch" in run.stdout, out[-3000:]  # ... and attempt 1 finished
    assert "trained attempt 0" not in run.stdout
    decs = decisions(kafka_bootstrap, prefix, job)
    assert [d["action"] for d in decs] == ["restart"], decs
    assert decs[0]["reason"]["category"] == "retryable", decs[0]["reason"]
    assert "ConnectionError" in decs[0]["evidence"]["first_error"]["line"]
