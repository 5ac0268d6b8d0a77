"""`faultwatch status` in a real terminal (tmux) over a real processor and agent."""

from __future__ import annotations

import json
import os
import shlex
import shutil
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from faultwatch.errors import EXIT_NOT_FOUND
from tests.support.waiting import wait_until

pytestmark = [pytest.mark.kafka, pytest.mark.slow]

CHILD = "import time\nwhile True:\n    print('step', flush=True)\n    time.sleep(0.5)\n"


@pytest.fixture
def procs() -> Iterator[list[subprocess.Popen[bytes]]]:
    out: list[subprocess.Popen[bytes]] = []
    yield out
    for p in out:
        if p.poll() is None:
            p.terminate()
    for p in out:
        try:
            p.wait(timeout=30)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()


def _capture(session: str) -> str:
    return subprocess.run(["tmux", "capture-pane", "-p", "-t", session], capture_output=True,
                          text=True, timeout=10).stdout


def test_status_shows_a_live_job_in_a_terminal_and_as_json(
        kafka_bootstrap: str, topic_prefix: str, tmp_path: Path,
        procs: list[subprocess.Popen[bytes]]) -> None:
    assert shutil.which("tmux"), "tmux is needed for the terminal test"
    job = f"status-{uuid.uuid4().hex[:6]}"
    env = {**os.environ, "FAULTWATCH_BOOTSTRAP": kafka_bootstrap}
    fw = [sys.executable, "-m", "faultwatch"]
    procs.append(subprocess.Popen([*fw, "process", "--topic-prefix", topic_prefix,
                                   "--app-id", f"fw-{topic_prefix}"], env=env,
                                  stdout=subprocess.DEVNULL,
                                  stderr=open(tmp_path / "process.log", "wb")))  # noqa: SIM115
    procs.append(subprocess.Popen(
        [*fw, "agent", "--job", job, "--node", "n1", "--topic-prefix", topic_prefix,
         "--spool-dir", str(tmp_path / "spool"), "--run-id", "run-42", "--heartbeat-s", "0.5",
         "--no-follow-decisions", "--", sys.executable, "-c", CHILD],
        env=env, stdout=subprocess.DEVNULL,
        stderr=open(tmp_path / "agent.log", "wb")))  # noqa: SIM115
    session = f"fw{uuid.uuid4().hex[:6]}"
    cmd = " ".join(shlex.quote(x) for x in [*fw, "status", "--watch", "--interval-s", "1",
                                             "--topic-prefix", topic_prefix])
    subprocess.run(["tmux", "new-session", "-d", "-s", session, "-x", "220", "-y", "40",
                    f"env PYTHONPATH={shlex.quote(os.environ.get('PYTHONPATH', ''))} "
                    f"FAULTWATCH_BOOTSTRAP={kafka_bootstrap} COLUMNS=200 {cmd}"],
                   check=True, timeout=10)
    try:
        def live_row(screen: str) -> str:
            return next((line for line in screen.splitlines() if job in line), "")

        screen = wait_until(lambda: _capture(session), 120, f"a live row for {job}",
                            interval_s=0.5,
                            until=lambda s: "running" in live_row(s) and "1/1" in live_row(s),
                            detail=lambda: (tmp_path / "process.log").read_text()[-2000:])
        row = live_row(screen)
        assert "faultwatch status" in screen and "run-42" in row
        subprocess.run(["tmux", "send-keys", "-t", session, "C-c"], check=True, timeout=10)
        wait_until(lambda: subprocess.run(["tmux", "has-session", "-t", session],
                                          capture_output=True).returncode != 0,  # ends with it
                   30, "Ctrl-C to stop `status --watch`", interval_s=0.3)
    finally:
        subprocess.run(["tmux", "kill-session", "-t", session], capture_output=True)
    out = subprocess.run([*fw, "status", "--json", "--job", job, "--topic-prefix",
                          topic_prefix], env=env, capture_output=True, timeout=60)
    assert out.returncode == 0, out.stderr.decode()[-2000:]
    [snap] = [json.loads(line) for line in out.stdout.splitlines()]
    assert (snap["job"], snap["run_id"], snap["phase"], snap["nodes_alive"]) == (
        job, "run-42", "running", 1)
    assert snap["last_output_age_s"] is not None and snap["last_output_age_s"] < 30
    # a job no processor reports is exit 7 (issue 23); the job above is the positive control
    out = subprocess.run([*fw, "status", f"never-{job}", "--topic-prefix", topic_prefix],
                         env=env, capture_output=True, timeout=60)
    assert out.returncode == EXIT_NOT_FOUND, out.stderr.decode()[-2000:]
    assert f"no processor reports job 'never-{job}'" in out.stderr.decode()
