"""Helpers for the detector and processor-fault end-to-end tests: policy files, agents."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import yaml

from tests.support.cluster import agent_cmd, decisions
from tests.support.processes import job_env
from tests.support.waiting import wait_until

JOBS = Path(__file__).resolve().parents[1] / "e2e" / "jobs"
SCENARIOS = JOBS / "scenarios.py"


def policy_file(path: Path, **policy: Any) -> Path:
    path.write_text(yaml.safe_dump({"version": 1, "policy": policy}))
    return path


def scenario(*args: object) -> list[str]:
    return [sys.executable, str(SCENARIOS), *map(str, args)]


def new_job(name: str) -> str:
    return f"{name}-{uuid.uuid4().hex[:6]}"


class Agents:
    """Agents started by a test; all stopped (SIGKILL to their groups) at the end."""

    def __init__(self, bootstrap: str, prefix: str, tmp: Path) -> None:
        self.bootstrap, self.prefix, self.tmp = bootstrap, prefix, tmp
        self.procs: list[subprocess.Popen[bytes]] = []

    def start(self, job: str, node: str, cmd: list[str], attempt: int = 0,
              flags: tuple[str, ...] = (), **env: str) -> subprocess.Popen[bytes]:
        full = agent_cmd(self.bootstrap, self.prefix, job, node, cmd, *flags,
                         "--attempt", str(attempt),
                         "--no-follow-decisions", "--spool-dir",
                         str(self.tmp / f"spool-{node}-{attempt}"))
        p = subprocess.Popen(full, env=job_env(**env), stdout=subprocess.DEVNULL,
                             stderr=subprocess.DEVNULL, start_new_session=True)
        self.procs.append(p)
        return p

    def run(self, job: str, node: str, cmd: list[str], attempt: int = 0,
            timeout: float = 60) -> int:
        p = self.start(job, node, cmd, attempt)
        return p.wait(timeout)

    def stop_all(self) -> None:
        """SIGTERM first, so that each agent stops its child (the child runs in a session of
        its own: a SIGKILL to the agent's group alone left it running after the test), then
        SIGKILL to whatever group is left after 10 s."""
        alive = [p for p in self.procs if p.poll() is None]
        for p in alive:
            _signal_group(p.pid, signal.SIGTERM)
        for p in alive:
            try:
                p.wait(10)
            except subprocess.TimeoutExpired:
                _signal_group(p.pid, signal.SIGKILL)
                p.wait(10)


def _signal_group(pgid: int, sig: signal.Signals) -> None:
    try:
        os.killpg(pgid, sig)
    except ProcessLookupError:
        pass


@contextmanager
def agents(bootstrap: str, prefix: str, tmp: Path) -> Iterator[Agents]:
    a = Agents(bootstrap, prefix, tmp)
    try:
        yield a
    finally:
        a.stop_all()


def wait_for(bootstrap: str, prefix: str, job: str, pred: Any,
             timeout_s: float = 60.0) -> list[dict[str, Any]]:
    """Poll the job's decisions (deduped by id) until pred(decisions) holds; after
    `timeout_s` the last ones read (the caller asserts on them)."""
    return wait_until(lambda: decisions(bootstrap, prefix, job), timeout_s,
                      f"decisions of {job}", interval_s=0.7, until=pred, raise_on_timeout=False)


def kinds(decs: list[dict[str, Any]]) -> list[tuple[str, str]]:
    """(action, kind) of each decision but the `diagnose` requests before a hang."""
    return [(d["action"], d["reason"]["kind"]) for d in decs if d["reason"]["kind"] != "diagnose"]
