"""A two-node torchrun job with hot spares on this machine: agents with distinct node names, one
c10d rendezvous on loopback, a training loop that checkpoints every step (e2e/jobs/ckpt_train.py).
Shared by tests/e2e/test_hot_spares.py and bench/hot_spare.py."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tests.support.processes import faultwatch_exe, job_env, stop_group

JOB_SCRIPT = Path(__file__).resolve().parents[1] / "e2e" / "jobs" / "ckpt_train.py"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def torchrun_line(port: int, rdzv_id: str, nnodes: int = 2) -> list[str]:
    """One node's torchrun of the job: c10d rendezvous on loopback, one rank per node."""
    return [sys.executable, "-m", "torch.distributed.run", f"--nnodes={nnodes}",
            "--nproc-per-node=1", "--rdzv-backend=c10d", f"--rdzv-endpoint=127.0.0.1:{port}",
            f"--rdzv-id={rdzv_id}", "--max-restarts=0", "--monitor-interval=0.5",
            str(JOB_SCRIPT)]


@dataclass
class SpareJob:
    """The agents of one job: `procs` and their stderr logs and verdict files, by node."""

    bootstrap: str
    prefix: str
    job: str
    tmp: Path
    total: int
    spares: int
    fault_env: dict[str, str]
    port: int = field(default_factory=free_port)
    procs: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)

    @property
    def timeline(self) -> Path:
        return self.tmp / "timeline.jsonl"

    def log(self, node: str) -> Path:
        return self.tmp / f"{node}.err"

    def verdict(self, node: str) -> dict[str, Any]:
        return dict(json.loads((self.tmp / f"{node}.verdict.json").read_text()))

    def start(self, node: str, index: int, *flags: str) -> subprocess.Popen[bytes]:
        """The agent of `node` (place `index` of `total`): active or spare by its place."""
        argv = [faultwatch_exe(), "agent", "--bootstrap", self.bootstrap, "--topic-prefix",
                self.prefix, "--job", self.job, "--node", node, "--heartbeat-s", "0.5",
                "--spool-dir", str(self.tmp / "spool"), "--follow-decisions",
                "--spares", str(self.spares), "--node-index", str(index),
                "--nodes-total", str(self.total), "--nnodes", str(self.total - self.spares),
                "--spare-note-s", "1", "--term-grace-s", "5",
                "--verdict-out", str(self.tmp / f"{node}.verdict.json"), *flags, "--",
                *torchrun_line(self.port, self.job, self.total - self.spares)]
        env = job_env(FW_CKPT=str(self.tmp / "ckpt.json"), FW_TIMELINE=str(self.timeline),
                      **self.fault_env)
        with open(self.log(node), "wb") as err:
            p = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=err, env=env,
                                 start_new_session=True)
        self.procs[node] = p
        return p

    def wait_all(self, timeout_s: float) -> dict[str, int]:
        """Every agent's exit code, once all exited (the rest stopped after `timeout_s`)."""
        deadline = time.monotonic() + timeout_s
        codes: dict[str, int] = {}
        for node, p in self.procs.items():
            try:
                codes[node] = p.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                stop_group(p)
                codes[node] = -1
        return codes

    def stop(self) -> None:
        for p in self.procs.values():
            stop_group(p, grace_s=10)

    def steps(self) -> list[dict[str, Any]]:
        """The training steps of the job's timeline (not its workers' start events)."""
        if not self.timeline.exists():
            return []
        rows = [json.loads(x) for x in self.timeline.read_text().splitlines() if x.strip()]
        return [r for r in rows if "step" in r]

    def tails(self, n: int = 2500) -> str:
        return "\n".join(f"--- {node}\n{self.log(node).read_text(errors='replace')[-n:]}"
                         for node in self.procs)
