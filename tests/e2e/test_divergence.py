"""Divergence end to end: a real Hugging Face Trainer job (tests/e2e/jobs/hf_diverge.py, GPT-2
built from a config, CPU, plain python under `faultwatch run`) whose weights turn NaN gets a
divergence notice from its own log lines; with `divergence_action: fail` the job is stopped
and failed; a healthy twin in the same run gets nothing (the negative with its positive
control). A real Lightning job (tests/e2e/jobs/lightning_diverge.py) whose weights turn NaN
gets the notice from its progress bar (`train_loss=nan.0`). The four jobs run side by side:
one import's wait, not four."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path
from typing import Any

import pytest

from tests.support.processes import faultwatch_exe

ROOT = Path(__file__).resolve().parents[2]
TRAIN_PY = ROOT / ".venv-train" / "bin" / "python"
JOB = Path(__file__).parent / "jobs" / "hf_diverge.py"
LIGHTNING_JOB = Path(__file__).parent / "jobs" / "lightning_diverge.py"
EXIT_FAILED = 78  # `faultwatch run`'s exit for a fail decision (docs/cli.md)
# one Trainer job is ~25 s of CPU; on a loaded 2-core machine the three take minutes of wall
pytestmark = [pytest.mark.slow, pytest.mark.timeout(1200)]


def _start(tmp: Path, name: str, policy: str = "", job: Path = JOB, **env: str
           ) -> tuple[subprocess.Popen[bytes], Path]:
    if os.environ.get("FAULTWATCH_NO_TRAIN_ENV"):
        pytest.skip("FAULTWATCH_NO_TRAIN_ENV is set: no training-image env (.venv-train)")
    assert TRAIN_PY.exists(), "scripts/bootstrap.sh builds .venv-train"
    d = tmp / name
    d.mkdir()
    decisions = d / "decisions.jsonl"
    flags = []
    if policy:
        (d / "rules.yaml").write_text(f"version: 1\npolicy:\n{policy}")
        flags = ["--rules", str(d / "rules.yaml")]
    cmd = [faultwatch_exe(), "run", "--decisions-out", str(decisions), "--settle-s", "1",
           "--term-grace-s", "5", *flags, "--", str(TRAIN_PY), str(job), str(d / "out")]
    full_env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONWARNINGS="ignore",
                    HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", PYTHONPATH=str(ROOT), **env)
    with open(d / "output.log", "wb") as log:  # a file: three jobs' pipes never fill up
        return subprocess.Popen(cmd, env=full_env, stdout=log, stderr=subprocess.STDOUT,
                                start_new_session=True), decisions


def _finish(p: subprocess.Popen[bytes], decisions: Path) -> tuple[int, list[dict[str, Any]], str]:
    try:
        p.wait(timeout=1000)  # a loaded 2-core machine imports torch slowly
    finally:
        if p.poll() is None:  # faultwatch stops its job on SIGTERM
            p.terminate()
            p.wait(60)
    out = (decisions.parent / "output.log").read_text(errors="replace").replace("\r", "\n")
    got = [json.loads(x) for x in decisions.read_text().splitlines()] \
        if decisions.exists() else []
    return p.returncode, [d for d in got if d["reason"]["kind"] == "divergence"], out


def test_nan_loss_is_noticed_or_failed_as_configured_and_a_healthy_twin_is_left_alone(
        tmp_path: Path) -> None:
    runs = [_start(tmp_path, "healthy", FW_NAN_AT="0"),
            _start(tmp_path, "notice", FW_NAN_AT="4"),
            _start(tmp_path, "fail", "  divergence_action: fail\n", FW_NAN_AT="4",
                   STEPS="400", FW_STEP_SLEEP_S="0.2"),
            _start(tmp_path, "lightning", job=LIGHTNING_JOB, FW_NAN_AT="10")]
    try:
        (rc_h, decs_h, out_h), (rc_n, decs_n, out_n), (rc_f, decs_f, out_f), \
            (rc_l, decs_l, out_l) = [_finish(*r) for r in runs]
    finally:
        for p, _ in runs:
            if p.poll() is None:
                p.kill()

    # the healthy twin: its losses were read (the same lines, the same parser), none decided
    assert rc_h == 0 and "trained" in out_h and "'loss': " in out_h, out_h[-3000:]
    assert decs_h == []

    # NaN weights from step 5: one notice, the job runs to its end
    assert rc_n == 0 and "trained" in out_n, out_n[-3000:]
    assert [(d["action"], d["reason"]["category"]) for d in decs_n] == [
        ("notify", "divergence")], decs_n
    ev = decs_n[0]["evidence"]
    assert ev["loss"] == "nan" and ev["key"] in ("loss", "loss(hf-nan-filtered)")
    assert "training diverged" in decs_n[0]["reason"]["message"]

    # the same with divergence_action: fail -- stopped long before its 400 steps, failed
    assert rc_f == EXIT_FAILED and "trained" not in out_f, out_f[-3000:]
    assert [d["action"] for d in decs_f] == ["fail"], decs_f
    assert "failing the job" in decs_f[0]["reason"]["message"]

    # Lightning: the NaN read from its progress bar (`train_loss=nan.0`), one notice, the
    # job runs to its end
    assert rc_l == 0 and "trained" in out_l and "train_loss=nan.0" in out_l, out_l[-3000:]
    assert [(d["action"], d["reason"]["category"]) for d in decs_l] == [
        ("notify", "divergence")], decs_l
    assert decs_l[0]["evidence"]["loss"] == "nan", decs_l[0]["evidence"]
    assert decs_l[0]["evidence"]["key"] == "train_loss", decs_l[0]["evidence"]
