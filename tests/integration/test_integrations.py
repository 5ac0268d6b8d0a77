"""The framework callbacks, in real Hugging Face and Lightning jobs from the training image env.

The jobs run with .venv-train (the newest transformers/lightning beside faultwatch's node side);
a real Unix socket stands where the agent's SDK server would, recording what the SDK sends.
Both jobs run at once (each is one single-threaded process: on 2 cores together they take
about the time of one); a rerun of a test records its job anew.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import threading
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
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


JOB_SCRIPTS = {"huggingface": "hf_tiny.py", "lightning": "lightning_tiny.py"}


class Recordings:
    """The module's jobs, recorded concurrently from the start; `take` hands a test its job's
    messages and directory, a second `take` (a rerun) records the job again."""

    def __init__(self, tmp: pytest.TempPathFactory, wanted: set[str]):
        self.tmp = tmp
        self.pool = ThreadPoolExecutor(max_workers=len(JOB_SCRIPTS))
        self.started: dict[str, tuple[Future[list[dict[str, Any]]], Path]] = {
            name: self._start(name) for name in wanted}
        self.taken: set[str] = set()

    def _start(self, name: str) -> tuple[Future[list[dict[str, Any]]], Path]:
        tmp = self.tmp.mktemp(name)
        return self.pool.submit(_run_recording, JOBS / JOB_SCRIPTS[name], tmp), tmp

    def take(self, name: str) -> tuple[list[dict[str, Any]], Path]:
        if name in self.taken or name not in self.started:
            self.started[name] = self._start(name)
        self.taken.add(name)
        future, tmp = self.started[name]
        return future.result(), tmp


@pytest.fixture(scope="module")
def recordings(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
               ) -> Iterator[Recordings]:
    _train_python()
    wanted = {name for name in JOB_SCRIPTS
              if any(item.name.startswith(f"test_{name}_") for item in request.session.items)}
    both = Recordings(tmp_path_factory, wanted)
    try:
        yield both
    finally:
        both.pool.shutdown(wait=True)


def _stages(msgs: list[dict[str, Any]]) -> list[tuple[str, bool]]:
    return [(m["d"]["stage"], m["d"]["opens"]) for m in msgs if m["k"] == "stage"]


def _steps(msgs: list[dict[str, Any]]) -> list[int]:
    return [m["d"]["step"] for m in msgs if m["k"] == "progress"]


def test_huggingface_trainer_reports_steps_eval_and_saves(recordings: Recordings) -> None:
    msgs, tmp_path = recordings.take("huggingface")
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


def test_lightning_reports_steps_validation_and_checkpoint(recordings: Recordings) -> None:
    msgs, _ = recordings.take("lightning")
    steps = _steps(msgs)
    assert steps and steps == sorted(steps) and steps[-1] == 12
    # the loss rides on every progress note (its bar, rich, prints nothing off a terminal)
    losses = [m["d"]["metrics"].get("loss") for m in msgs if m["k"] == "progress"]
    assert losses and all(isinstance(x, float) for x in losses), losses
    st = _stages(msgs)
    assert ("eval", True) in st and ("eval", False) in st
    assert ("checkpoint", True) in st
    assert st[-1][1] is False  # the last stage was closed by the end of training
