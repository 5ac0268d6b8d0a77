"""Cluster-mode harness for end-to-end tests: a real processor worker and agents on Kafka."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from tests.e2e.conftest import faultwatch_exe, job_env


@contextmanager
def processor(bootstrap: str, prefix: str, log: Path,
              *flags: str) -> Iterator[subprocess.Popen[bytes]]:
    """A `faultwatch process` worker; stopped with SIGTERM (then SIGKILL) at the end."""
    with open(log, "wb") as out:
        proc = subprocess.Popen([faultwatch_exe(), "process", "--bootstrap", bootstrap,
                                 "--topic-prefix", prefix, "--partitions", "2", *flags],
                                stdout=out, stderr=subprocess.STDOUT, env=job_env(),
                                start_new_session=True)
    try:
        yield proc
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.wait(20)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(10)


def agent_cmd(bootstrap: str, prefix: str, job: str, node: str, cmd: list[str],
              *flags: str) -> list[str]:
    return [faultwatch_exe(), "agent", "--bootstrap", bootstrap, "--topic-prefix", prefix,
            "--job", job, "--node", node, "--heartbeat-s", "1",
            "--no-follow-decisions", *flags, "--", *cmd]  # plain ship-and-exit unless flags say


def decisions(bootstrap: str, prefix: str, job: str) -> list[dict[str, Any]]:
    """The job's decisions on the topic now, read with the real CLI (deduped by id)."""
    out = subprocess.run([faultwatch_exe(), "decisions", "--bootstrap", bootstrap,
                          "--topic-prefix", prefix, "--job", job, "--json"],
                         capture_output=True, text=True, timeout=60, env=job_env())
    assert out.returncode == 0, out.stderr
    return [json.loads(x) for x in out.stdout.splitlines() if x.strip()]


def wait_decisions(bootstrap: str, prefix: str, job: str, count: int = 1,
                   timeout_s: float = 60.0) -> list[dict[str, Any]]:
    deadline = time.time() + timeout_s
    got: list[dict[str, Any]] = []
    while time.time() < deadline:
        got = decisions(bootstrap, prefix, job)
        if len(got) >= count:
            return got
        time.sleep(1.0)
    return got
