"""`faultwatch agent tail` against a real broker: rotation, truncation, restart from state."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from faultwatch import wire
from tests.support.kafka import consume

pytestmark = pytest.mark.kafka


def tail_argv(bootstrap: str, prefix: str, tmp: Path, *paths: Path) -> list[str]:
    return [sys.executable, "-m", "faultwatch", "agent", "tail", "--bootstrap",
            bootstrap, "--topic-prefix", prefix, "--job", "tj", "--node", "n1",
            "--spool-dir", str(tmp / "spool"), "--poll-s", "0.1", "--heartbeat-s", "0.3",
            *map(str, paths)]


def append(p: Path, *lines: str) -> None:
    with p.open("a") as f:
        f.write("".join(x + "\n" for x in lines))


def stop(p: subprocess.Popen[bytes]) -> bytes:
    p.send_signal(signal.SIGTERM)
    _, err = p.communicate(timeout=30)
    assert p.returncode == 0, err.decode()[-2000:]
    return err


def test_tail_rotation_truncation_and_restart(kafka_bootstrap: str, topic_prefix: str,
                                              tmp_path: Path) -> None:
    log = tmp_path / "train.log"
    append(log, "old 1", "old 2")
    argv = tail_argv(kafka_bootstrap, topic_prefix, tmp_path, log)
    p = subprocess.Popen(argv, stderr=subprocess.PIPE)
    time.sleep(1.0)
    append(log, "old 3")
    time.sleep(0.5)
    os.rename(log, tmp_path / "train.log.1")  # logrotate: rename, then a new file
    append(tmp_path / "train.log.1", "old 4 (written after the rename)")
    append(log, "new 1")
    time.sleep(1.0)
    log.write_text("after truncate 1\n")  # copytruncate-style rewrite
    time.sleep(1.0)
    err = stop(p)
    assert b"event=tail_rotated" in err and b"event=tail_truncated" in err
    append(log, "while down")  # the agent is not running
    p = subprocess.Popen(argv, stderr=subprocess.PIPE)
    time.sleep(1.0)
    append(log, "after restart")
    time.sleep(1.0)
    stop(p)

    want = ["old 1", "old 2", "old 3", "old 4 (written after the rename)", "new 1",
            "after truncate 1", "while down", "after restart"]
    recs = consume(kafka_bootstrap, f"{topic_prefix}logs",
                   lambda rs: sum(len(wire.lines_of(r)) for r in rs if r["t"] == "lines")
                   >= len(want), timeout=30)
    lines = [ln for r in recs if r["t"] == "lines" for ln in wire.lines_of(r)]
    assert [ln.text for ln in lines] == want  # each once, in order, across the restart
    assert [ln.seq for ln in lines] == list(range(len(want)))
    assert len({r["run_id"] for r in recs if r["t"] == "lines"}) == 1
    hbs = [r for r in recs if r["t"] == "hb"]
    assert hbs and hbs[-1]["last_output_ts"] is not None
    starts = [r for r in recs if r["t"] == "start"]
    assert starts[0]["cmd"][0] == "tail" and len(starts) == 2
