"""One supervisor, two transports: every scenario under `faultwatch run` and under
`faultwatch agent` + a real `faultwatch process` on the shared broker, same policy.

Restart (next attempt, the processor's backoff honoured), blacklist, fail, SIGTERM
escalation, the SDK, and a child whose leftovers hold its pipes open must behave the same.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from faultwatch.agents.config import EXIT_BLACKLISTED, EXIT_FAILED
from tests.support.cluster import decisions, processor, wait_decisions
from tests.support.processes import faultwatch_exe, job_env

pytestmark = [pytest.mark.slow, pytest.mark.kafka]

HANG_WINDOW_S = 4.0
BACKOFF_S = 4.0
GRACE_S = 2.0
RULES = f"""\
version: 1
policy:
  enable_restart: true
  max_restarts: 3
  hang_detection: true
  restart_backoff_s: {BACKOFF_S}
  settle_s: 0.5
  hang_window_s: {HANG_WINDOW_S}
rules: []
"""
RETRYABLE = "RuntimeError: Socket Timeout"
HARDWARE = "NVRM: Xid (PCI:0000:3b:00): 79, pid=1234, GPU has fallen off the bus."
FATAL = "ModuleNotFoundError: No module named 'flux'"


@dataclass
class Mode:
    """How to run a command under faultwatch in one mode, and read its job's decisions."""

    name: str
    rules: Path
    tmp: Path
    bootstrap: str = ""
    prefix: str = ""
    # agent mode: one node name per test. The processor is shared by the module's tests and
    # keeps a fleet-wide node registry: a node blacklisted by one test stays quarantined,
    # and the next job starting on it would be turned away at once (the registry's gate).
    agent_node: str = field(default_factory=lambda: f"node-{uuid.uuid4().hex[:6]}")

    @property
    def node(self) -> str:
        return "local" if self.name == "run" else self.agent_node

    def cmd(self, job: str, child: list[str]) -> list[str]:
        common = ["--job", job, "--term-grace-s", str(GRACE_S)]
        if self.name == "run":
            return [faultwatch_exe(), "run", "--rules", str(self.rules), "--decisions-out",
                    str(self.tmp / f"{job}.jsonl"), *common, "--", *child]
        return [faultwatch_exe(), "agent", "--bootstrap", self.bootstrap, "--topic-prefix",
                self.prefix, "--node", self.node, "--heartbeat-s", "1", "--spool-dir",
                str(self.tmp / "spool"), "--follow-decisions", "--decision-wait-s", "40",
                "--exit-flush-timeout-s", "5", *common, "--", *child]

    def decisions(self, job: str, count: int = 1) -> list[dict[str, Any]]:
        """The job's decisions (waiting up to 30 s for `count` of them in agent mode)."""
        if self.name == "run":
            out = self.tmp / f"{job}.jsonl"
            got = [json.loads(x) for x in out.read_text().splitlines()] if out.exists() \
                else []  # as in agent mode, without the diagnose requests before a hang
            return [d for d in got if d["reason"]["kind"] != "diagnose"]
        return wait_decisions(self.bootstrap, self.prefix, job, count, timeout_s=30)

    def decisions_now(self, job: str) -> list[dict[str, Any]]:
        return self.decisions(job) if self.name == "run" else \
            decisions(self.bootstrap, self.prefix, job)


@pytest.fixture(scope="module")
def rules_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    p = tmp_path_factory.mktemp("rules") / "scenario.yaml"
    p.write_text(RULES)
    return p


@pytest.fixture(scope="module")
def cluster(kafka_bootstrap: str, rules_file: Path,
            tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, str]]:
    prefix = f"sup{uuid.uuid4().hex[:8]}."
    log = tmp_path_factory.mktemp("supproc") / "processor.log"
    with processor(kafka_bootstrap, prefix, log, "--rules", str(rules_file)) as proc:
        yield kafka_bootstrap, prefix
        assert proc.poll() is None, f"processor died:\n{log.read_text()[-4000:]}"


@pytest.fixture(params=["run", "agent"])
def mode(request: pytest.FixtureRequest, rules_file: Path, tmp_path: Path) -> Mode:
    if request.param == "run":
        return Mode("run", rules_file, tmp_path)
    bootstrap, prefix = request.getfixturevalue("cluster")
    return Mode("agent", rules_file, tmp_path, bootstrap, prefix)


def job_name(what: str) -> str:
    return f"{what}-{uuid.uuid4().hex[:6]}"


def run(mode: Mode, job: str, child: list[str], timeout: float = 120,
        **env: str) -> tuple[subprocess.CompletedProcess[str], float]:
    t0 = time.monotonic()
    proc = subprocess.run(mode.cmd(job, child), env=job_env(**env), capture_output=True,
                          text=True, timeout=timeout)
    return proc, time.monotonic() - t0


def starts(path: Path) -> list[tuple[int, float]]:
    """(attempt, wall time) of every launch the child recorded."""
    if not path.exists():
        return []
    return [(int(a), float(t)) for a, t in (ln.split() for ln in path.read_text().split("\n")
                                            if ln.strip())]


def launch_logger(path: Path, then: str) -> list[str]:
    """sh: record (attempt, time) of this launch in path, then run `then`."""
    return ["sh", "-c", f'echo "$FAULTWATCH_ATTEMPT $(date +%s.%N)" >> {path}; {then}']


def test_restart_relaunches_next_attempt_after_not_before(mode: Mode, tmp_path: Path) -> None:
    job, log = job_name("restart"), tmp_path / "starts"
    child = launch_logger(log, f'if [ "$FAULTWATCH_ATTEMPT" -lt 2 ]; then '
                               f'echo "{RETRYABLE}" >&2; exit 1; fi; echo done')
    proc, _ = run(mode, job, child)
    assert proc.returncode == 0, proc.stderr[-3000:]
    decs = mode.decisions(job, 2)
    assert [(d["action"], d["attempt"]) for d in decs] == [("restart", 0), ("restart", 1)], decs
    launched = starts(log)
    assert [a for a, _ in launched] == [0, 1, 2], launched
    for d, (_, started) in zip(decs, launched[1:], strict=True):
        not_before = d["evidence"]["restart_not_before"]
        assert started >= not_before - 0.05, (started, d["evidence"])
    # control: the second restart really was held back (backoff after a recent restart)
    assert decs[1]["evidence"]["restart_not_before"] - decs[1]["ts"] > 0.5, decs[1]


def test_blacklist_naming_this_node_exits_138_without_relaunch(mode: Mode,
                                                              tmp_path: Path) -> None:
    job, log = job_name("blacklist"), tmp_path / "starts"
    proc, _ = run(mode, job, launch_logger(log, f'echo "{HARDWARE}" >&2; exit 1'))
    assert proc.returncode == EXIT_BLACKLISTED, proc.stderr[-3000:]
    decs = mode.decisions(job)
    assert [d["action"] for d in decs] == ["blacklist"], decs
    assert decs[0]["targets"]["nodes"] == [mode.node]
    assert [a for a, _ in starts(log)] == [0]


def test_fatal_error_fails_and_stops(mode: Mode, tmp_path: Path) -> None:
    job, log = job_name("fatal"), tmp_path / "starts"
    proc, _ = run(mode, job, launch_logger(log, f'echo "{FATAL}" >&2; exit 3'))
    # the fail decision's code; the child's own 3 is reported, never passed through
    assert proc.returncode == EXIT_FAILED, proc.stderr[-3000:]
    assert "command exited with code 3" in proc.stderr
    decs = mode.decisions(job)
    assert [d["action"] for d in decs] == ["fail"], decs
    assert [a for a, _ in starts(log)] == [0]


IGNORES_TERM = ("import signal, sys, time\n"
                "signal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
                "print('ready', flush=True)\n"
                "time.sleep(120)\n")


def test_sigterm_escalates_to_sigkill_within_grace(mode: Mode) -> None:
    # The child ignores SIGTERM and a setsid'd grandchild holds its pipes open.
    job = job_name("sigterm")
    child = ["sh", "-c", f'setsid sleep 120 & echo "leftover $!"; '
                         f'exec {sys.executable} -c "{IGNORES_TERM}"']
    proc = subprocess.Popen(mode.cmd(job, child), env=job_env(), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    leftover = 0
    try:
        assert proc.stdout is not None
        for line in proc.stdout:
            if line.startswith("leftover "):
                leftover = int(line.split()[1])
            if line.strip() == "ready":
                break
        t0 = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        rc = proc.wait(timeout=30)
        took = time.monotonic() - t0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
        if leftover:
            os.kill(leftover, signal.SIGKILL)
    # the agent was stopped by SIGTERM (143); its child, SIGKILLed after the grace, was 137
    assert rc == 128 + signal.SIGTERM, proc.stderr.read()[-3000:] if proc.stderr else rc
    assert GRACE_S - 0.5 <= took <= GRACE_S + 8, took


SDK_CHILD = ("import os\n"
             "from faultwatch import sdk\n"
             "assert os.environ.get('FAULTWATCH_SDK_SOCKET'), 'no SDK socket'\n"
             "sdk.notify('loss is NaN at step 7')\n"
             "print('sent', flush=True)\n")


def test_sdk_notify_becomes_a_notify_decision(mode: Mode) -> None:
    job = job_name("sdk")
    proc, _ = run(mode, job, [sys.executable, "-c", SDK_CHILD])
    assert proc.returncode == 0, proc.stderr[-3000:]
    decs = mode.decisions(job)
    assert [d["action"] for d in decs] == ["notify"], decs
    assert "loss is NaN at step 7" in json.dumps(decs[0])


def test_leftover_holding_the_pipes_does_not_delay_the_exit(mode: Mode) -> None:
    job = job_name("setsid")
    # (the child lives a moment: asyncio's wait() called after the exit returned at once)
    proc, took = run(mode, job, ["sh", "-c",
                                 'setsid sleep 240 & echo "leftover $!"; sleep 1; exit 1'],
                     timeout=280)
    leftover = int(proc.stdout.split()[1])
    os.kill(leftover, signal.SIGKILL)
    assert proc.returncode == EXIT_FAILED, proc.stderr[-3000:]  # a fail decision (exit 1)
    # not the leftover's 240 s; `took` includes the run's start-up, 32-34 s on 2 loaded cores
    assert took < 150, took
    decs = mode.decisions(job)
    assert [(d["action"], d["reason"]["kind"]) for d in decs] == [("fail", "exit")], decs
    assert "event=pipes_held_open" in proc.stderr


def test_silent_child_is_a_hang_but_an_exited_one_is_not(mode: Mode) -> None:
    # Positive control first: a live child silent past the window is a hang (restarted).
    hung = job_name("hang")
    proc, _ = run(mode, hung, ["sh", "-c", '[ "$FAULTWATCH_ATTEMPT" = 0 ] && '
                                          '{ echo hi; sleep 60; }; echo done'])
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert [(d["action"], d["reason"]["kind"]) for d in mode.decisions(hung)] == \
        [("restart", "hang")]
    # A child that exited 0 leaving a silent process in its group is done, not hung.
    done = job_name("exited")
    proc, took = run(mode, done, ["sh", "-c", "sleep 40 & echo hi; exit 0"])
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert took < 25, took  # not the leftover's 40 s
    time.sleep(HANG_WINDOW_S + 2)  # past the window the control was decided in
    assert mode.decisions_now(done) == []
