"""The framework callbacks, in real Hugging Face and Lightning jobs from the training image env.

The jobs run with .venv-train (the newest transformers/lightning beside faultwatch's node side);
a real Unix socket stands where the agent's SDK server would, recording what the SDK sends.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import threading
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]
TRAIN_PY = ROOT / ".venv-train" / "bin" / "python"
JOBS = Path(__file__).parent / "jobs"
pytestmark = pytest.mark.slow


def _train_python() -> str:
    if os.environ.get("FAULTWATCH_NO_TRAIN_ENV"):
        pytest.skip("FAULTWATCH_NO_TRAIN_ENV is set: no training-image env (.venv-train)")
    assert TRAIN_PY.exists(), "scripts/bootstrap.sh builds .venv-train; it is missing"
    return str(TRAIN_PY)


def _run_recording(script: Path, tmp: Path) -> list[dict[str, Any]]:
    path = tmp / "sdk.sock"
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(str(path))
    server.listen(8)
    got: list[dict[str, Any]] = []

    def serve() -> None:
        while True:
            try:
                conn, _ = server.accept()
            except OSError:
                return
            threading.Thread(target=read, args=(conn,), daemon=True).start()

    def read(conn: socket.socket) -> None:
        buf = b""
        while chunk := conn.recv(65536):
            buf += chunk
            *lines, buf = buf.split(b"\n")
            got.extend(json.loads(x) for x in lines if x)

    threading.Thread(target=serve, daemon=True).start()
    env = dict(os.environ, FAULTWATCH_SDK_SOCKET=str(path), OMP_NUM_THREADS="1",
               PYTHONWARNINGS="ignore", HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1")
    out = subprocess.run([_train_python(), str(script), str(tmp / "out")], env=env,
                         capture_output=True, text=True, timeout=300)
    server.close()
    assert out.returncode == 0 and "trained" in out.stdout, out.stdout[-2000:] + out.stderr[-3000:]
    return got


def _stages(msgs: list[dict[str, Any]]) -> list[tuple[str, bool]]:
    return [(m["d"]["stage"], m["d"]["opens"]) for m in msgs if m["k"] == "stage"]


def _steps(msgs: list[dict[str, Any]]) -> list[int]:
    return [m["d"]["step"] for m in msgs if m["k"] == "progress"]


def test_huggingface_trainer_reports_steps_eval_and_saves(tmp_path: Path) -> None:
    msgs = _run_recording(JOBS / "hf_tiny.py", tmp_path)
    steps = _steps(msgs)
    assert steps and steps == sorted(steps) and steps[-1] == 12
    st = _stages(msgs)
    assert ("eval", True) in st and ("eval", False) in st
    assert ("checkpoint", True) in st and ("checkpoint", False) in st
    opened: set[str] = set()
    for name, opens in st:  # every stage opens before it closes, and all are closed
        assert opens != (name in opened), st
        (opened.add if opens else opened.discard)(name)
    assert not opened, st
    assert (tmp_path / "out" / "checkpoint-5").is_dir()


def test_lightning_reports_steps_validation_and_checkpoint(tmp_path: Path) -> None:
    msgs = _run_recording(JOBS / "lightning_tiny.py", tmp_path)
    steps = _steps(msgs)
    assert steps and steps == sorted(steps) and steps[-1] == 12
    st = _stages(msgs)
    assert ("eval", True) in st and ("eval", False) in st
    assert ("checkpoint", True) in st
    assert st[-1][1] is False  # the last stage was closed by the end of training
