"""Embedded mode end to end: `faultwatch run -- torchrun ...` on real gloo jobs."""

from __future__ import annotations

import json
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest

from tests.support.processes import faultwatch_exe, job_env, torchrun_cmd

pytestmark = pytest.mark.slow


def run(tmp_path: Path, flags: list[str], timeout: float = 120, calm: bool = False,
        **fault: str) -> tuple[int, list[dict[str, Any]], str, float]:
    """`faultwatch run` over torchrun; `calm`: with the default event lines a person gets
    (the test session's FAULTWATCH_LOG_LEVEL=info removed)."""
    out = tmp_path / "decisions.jsonl"
    cmd = [faultwatch_exe(), "run", "--decisions-out", str(out), "--settle-s", "1",
           "--term-grace-s", "3", *flags, "--", *torchrun_cmd()]
    env = job_env(**fault)
    if calm:
        env.pop("FAULTWATCH_LOG_LEVEL", None)
        env.pop("PYTHONUNBUFFERED", None)  # as a user's shell: the agent sets what tee needs
    t0 = time.time()
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout)
    decisions = [json.loads(x) for x in out.read_text().splitlines()] if out.exists() else []
    # the `diagnose` requests a silence raises before a hang decision are not decisions
    # about the job (core/diagnosis.py); the hang tests check them where they matter
    decisions = [d for d in decisions if d["reason"]["kind"] != "diagnose"]
    return proc.returncode, decisions, proc.stdout + proc.stderr, t0


def test_retryable_error_on_rank1_restarts_once_then_succeeds(tmp_path: Path) -> None:
    # the window: torchrun's silent exit under load (test_silent_rank_is_a_hang_within_window)
    rc, decs, output, _ = run(tmp_path, ["--max-restarts", "2", "--hang-window-s", "30"],
                              timeout=300, calm=True, FW_FAULT="retryable",
                              FW_FAULT_ATTEMPTS="0")
    assert [d["action"] for d in decs] == ["restart"], output
    d = decs[0]
    assert d["reason"]["kind"] == "error"
    assert d["targets"]["ranks"] == [1]
    first = d["evidence"]["first_error"]
    assert first["rank"] == 1
    assert "ConnectionError" in first["line"], first
    assert "Connection closed by peer" not in first["line"]
    assert rc == 0, output  # attempt 1 ran clean
    assert "decision RESTART" in output
    assert "rank 1 done" in output or "rank 0 done" in output
    # a calm terminal: each decision once, no event lines (nothing went wrong), one summary
    assert output.count("[faultwatch] decision ") == len(decs) == 1, output
    assert "event=" not in output, output
    summary = [ln for ln in output.splitlines() if ln.startswith("faultwatch run: ")]
    assert len(summary) == 1, output
    assert summary[0].startswith("faultwatch run: succeeded in attempt 1 after 1 restart "
                                 "(error of rank 1 at "), summary
    assert "1 decision; verdict success (exit 0)" in summary[0]
    # every rank's line carries its rank (torchrun told by the agent's environment)
    steps = [ln for ln in output.splitlines() if " loss " in ln]
    assert steps and all(ln.startswith(("[rank0]:", "[rank1]:")) for ln in steps), steps
    assert "rank ?" not in output and "is deprecated" not in output, output


def test_fatal_error_fails_without_restart(tmp_path: Path) -> None:
    rc, decs, output, _ = run(tmp_path, ["--max-restarts", "3"], FW_FAULT="fatal")
    assert [d["action"] for d in decs] == ["fail"], output
    first = decs[0]["evidence"]["first_error"]
    assert first["rank"] == 1 and "ModuleNotFoundError" in first["line"]
    assert decs[0]["reason"]["category"] == "fatal"
    assert rc != 0
    assert output.count("child_started") == 1  # never relaunched


def test_silent_rank_is_a_hang_within_window(tmp_path: Path) -> None:
    # torchrun itself is silent for 5-9 s between its ranks' last line and its exit on a
    # loaded 2-core box: a shorter window decides a (real, but unwanted here) hang then.
    window = 12.0
    rc, decs, output, _ = run(tmp_path, ["--hang-window-s", str(window), "--max-restarts", "1"],
                              FW_FAULT="hang", FW_FAULT_ATTEMPTS="0", FW_STEPS="6")
    hangs = [d for d in decs if d["reason"]["kind"] == "hang"]
    assert len(hangs) == 1 and hangs[0]["action"] == "restart", output
    ev = hangs[0]["evidence"]
    latency = hangs[0]["ts"] - ev["silent_since"]
    assert window <= latency <= window + 3.0, latency
    assert rc == 0, output  # the relaunched attempt finished


def test_clean_run_has_no_decision(tmp_path: Path) -> None:
    rc, decs, output, _ = run(tmp_path, ["--hang-window-s", "20"])
    assert rc == 0, output
    assert decs == []
    assert "decision" not in output.lower() or "decision " not in output


def test_demo_command_from_readme_prints_hang_decision(tmp_path: Path) -> None:
    t0 = time.time()
    proc = subprocess.run([faultwatch_exe(), "run", "--hang-window-s", "3", "--max-restarts",
                           "0", "--", "sh", "-c", "echo hello; sleep 40"],
                          capture_output=True, text=True, timeout=60)
    elapsed = time.time() - t0
    assert "decision FAIL" in proc.stderr and "kind=hang" in proc.stderr, proc.stderr
    assert "hello" in proc.stdout
    assert elapsed < 20  # window 3 s; generous for a loaded CI box
