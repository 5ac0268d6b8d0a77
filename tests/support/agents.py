"""`faultwatch agent` as a real process in integration tests: command lines, decisions to follow."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from faultwatch import wire
from faultwatch.core.events import Decision

UNREACHABLE = "127.0.0.1:9"  # discard port: nothing listens, connections are refused


def agent_cmd(bootstrap: str, prefix: str, spool: Path, job: str, *cmd: str,
              extra: tuple[str, ...] = ()) -> list[str]:
    return [sys.executable, "-m", "faultwatch", "agent", "--bootstrap", bootstrap,
            "--job", job, "--node", "n1", "--topic-prefix", prefix, "--spool-dir", str(spool),
            "--heartbeat-s", "0.2", "--no-follow-decisions", *extra, "--", *cmd]


def run_agent(argv: list[str], timeout: float = 60) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run(argv, capture_output=True, timeout=timeout)


def has_exit(recs: list[dict[str, Any]]) -> bool:
    return any(r["t"] == "exit" for r in recs)


# Runs until stopped.
FOREVER = "import time\nprint('running', flush=True)\nwhile True: time.sleep(0.05)\n"


def publish(bootstrap: str, topic: str, *decs: Decision) -> None:
    from aiokafka import AIOKafkaProducer

    async def main() -> None:
        p = AIOKafkaProducer(bootstrap_servers=bootstrap)
        await p.start()
        try:
            for d in decs:
                await p.send_and_wait(topic, wire.encode_decision(d), key=wire.job_key(d.job))
        finally:
            await p.stop()

    asyncio.run(main())


RUN = "R1"  # the run id the agents here are given (decisions act only on the run they name)


def decision(job: str, action: str, nodes: tuple[str, ...], attempt: int = 0,
             did: str | None = None, run_id: str = RUN) -> Decision:
    return Decision(id=did or f"{job}:{attempt}:{action}", job=job, attempt=attempt,
                    action=action, kind="error", ts=time.time(), nodes=nodes, run_id=run_id)


def start_agent(bootstrap: str, prefix: str, tmp: Path, job: str, script: str,
                *extra: str, env: dict[str, str] | None = None) -> subprocess.Popen[bytes]:
    # the decisions topic exists before the agent starts (the processor creates it)
    publish(bootstrap, f"{prefix}decisions", decision("other-job", "fail", ()))
    named = "--run-id" in extra or (env or {}).get("SLURM_JOB_ID")
    argv = agent_cmd(bootstrap, prefix, tmp, job, sys.executable, "-c", script,
                     extra=("--follow-decisions", "--decision-wait-s", "30",
                            *(() if named else ("--run-id", RUN)), *extra))
    return subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            env=None if env is None else {**os.environ, **env})
