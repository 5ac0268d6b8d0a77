"""A SIGKILLed agent's successor resends at most what was in flight, not what was acked."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from faultwatch import wire
from tests.support.agents import agent_cmd, run_agent
from tests.support.kafka import consume

pytestmark = pytest.mark.kafka

N_LINES = 40_000
# Prints its pid, N_LINES lines, then waits to be killed.
WRITER = (f"import os, sys, time\n"
          f"print('pid', os.getpid(), flush=True)\n"
          f"for i in range({N_LINES}): print('line', i, 'y' * 40)\n"
          f"sys.stdout.flush()\n"
          f"time.sleep(600)\n")


def line_count(recs: list[dict]) -> int:  # type: ignore[type-arg]
    return sum(len(wire.lines_of(r)) for r in recs if r["t"] == "lines")


def test_sigkilled_agent_resends_only_what_was_in_flight(
        kafka_bootstrap: str, topic_prefix: str, tmp_path: Path) -> None:
    spool = tmp_path / "spool"
    topic = f"{topic_prefix}logs"
    argv = agent_cmd(kafka_bootstrap, topic_prefix, spool, "resend", sys.executable, "-c",
                     WRITER)
    agent = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
    assert agent.stdout is not None
    child_pid = int(agent.stdout.readline().split()[1])
    try:
        recs = consume(kafka_bootstrap, topic, lambda rs: line_count(rs) >= N_LINES + 1,
                       timeout=60)
        assert line_count(recs) == N_LINES + 1  # every line acked once (the pid line too)
        time.sleep(1.0)  # the ack watermark is persisted within ~0.1 s
        agent.send_signal(signal.SIGKILL)
        agent.wait(timeout=10)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.kill(child_pid, signal.SIGKILL)
        if agent.poll() is None:
            agent.kill()
    assert any(spool.rglob("*.seg"))  # the killed agent left its active segment behind

    # The next agent on the same spool delivers what the killed one left.
    flush = run_agent([*argv[:argv.index("--")], "--flush"])
    assert flush.returncode == 0, flush.stderr.decode()[-2000:]
    after = consume(kafka_bootstrap, topic, lambda rs: False, timeout=5)
    resent = line_count(after) - (N_LINES + 1)
    print(f"\nresent after SIGKILL: {resent} of {N_LINES + 1} acked lines")
    assert resent <= N_LINES // 50, resent  # at most a window in flight, not everything
