"""Agent + real processor + real torchrun: a retryable failure is restarted once, then exit 0."""

from __future__ import annotations

import subprocess
import time
import uuid
from pathlib import Path

import pytest

from faultwatch import wire
from tests.support.cluster import agent_cmd, decisions, processor
from tests.support.kafka import consume
from tests.support.processes import job_env, torchrun_cmd

pytestmark = [pytest.mark.slow, pytest.mark.kafka]


def test_agent_restarts_job_on_decision_and_exits_0(kafka_bootstrap: str,
                                                    tmp_path: Path) -> None:
    prefix = f"e2ea{uuid.uuid4().hex[:8]}."
    job = f"retry-once-{uuid.uuid4().hex[:6]}"
    with processor(kafka_bootstrap, prefix, tmp_path / "processor.log", "--hang-window-s", "5",
                   "--settle-s", "1") as proc:
        time.sleep(2.0)
        assert proc.poll() is None, (tmp_path / "processor.log").read_text()
        cmd = agent_cmd(kafka_bootstrap, prefix, job, "node-0", torchrun_cmd(),
                        "--spool-dir", str(tmp_path / "spool"), "--follow-decisions",
                        "--decision-wait-s", "60")
        res = subprocess.run(cmd, env=job_env(FW_FAULT="retryable", FW_FAULT_ATTEMPTS="0"),
                             capture_output=True, text=True, timeout=180)
        assert res.returncode == 0, res.stderr[-4000:]
        assert res.stderr.count("event=restart ") == 1
        assert "rank 0 done" in res.stdout and "rank 1 done" in res.stdout
        decs = decisions(kafka_bootstrap, prefix, job)
        assert [(d["action"], d["attempt"]) for d in decs] == [("restart", 0)], decs
        assert proc.poll() is None
    recs = consume(kafka_bootstrap, f"{prefix}logs",
                   lambda rs: sum(r["t"] == "exit" for r in rs) >= 2)
    exits = [wire.exit_of(r) for r in recs if r["t"] == "exit"]
    assert [(e.attempt, e.exit_code) for e in exits] == [(0, 1), (1, 0)]
