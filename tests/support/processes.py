"""Running faultwatch and training jobs as real processes: the executable, torchrun, env."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
TRAIN = EXAMPLES / "train_gloo.py"  # the demo job: faults chosen by FW_* environment variables


def faultwatch_exe() -> str:
    exe = Path(sys.executable).parent / "faultwatch"
    return str(exe) if exe.exists() else shutil.which("faultwatch") or "faultwatch"


def torchrun_cmd(nproc: int = 2, script: Path = TRAIN) -> list[str]:
    """torchrun on this interpreter, standalone rendezvous (a free port per job)."""
    return [sys.executable, "-m", "torch.distributed.run", "--standalone",
            f"--nproc-per-node={nproc}", str(script)]


def job_env(**fault: str) -> dict[str, str]:
    env = dict(os.environ)
    env.update(OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1", PYTHONWARNINGS="ignore")
    env.update(fault)
    return env


def fw(*args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    """Run `faultwatch ARGS` to completion, text output captured."""
    return subprocess.run([faultwatch_exe(), *args], capture_output=True, text=True,
                          timeout=timeout, env=job_env())


def stop_group(proc: subprocess.Popen[bytes], sig: int = signal.SIGTERM,
               grace_s: float = 20.0) -> None:
    """Stop a process started with start_new_session=True and its group: `sig`, then SIGKILL
    after `grace_s`."""
    if proc.poll() is None:
        os.killpg(proc.pid, sig)
        try:
            proc.wait(grace_s)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(10)


def cpu_s(pid: int) -> float:
    """User + system CPU seconds of one process, from /proc."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def log_lines(log: Path) -> int:
    """How many lines a log file has now."""
    with open(log, "rb") as f:
        return sum(1 for _ in f)
