"""`faultwatch agent tail` against a real broker: rotation, truncation, restart from state."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

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


def start(argv: list[str], err: Path) -> subprocess.Popen[bytes]:
    """The agent, its stderr (debug events included) to a file: an unread pipe could fill."""
    with err.open("ab") as out:
        return subprocess.Popen(argv, stderr=out)


def stop(p: subprocess.Popen[bytes], err: Path) -> bytes:
    p.send_signal(signal.SIGTERM)
    p.wait(timeout=30)
    text = err.read_bytes()
    assert p.returncode == 0, text.decode(errors="replace")[-2000:]
    return text


def test_tail_rotation_truncation_and_restart(kafka_bootstrap: str, topic_prefix: str,
                                              tmp_path: Path) -> None:
    def shipped(n: int) -> None:  # the agent has read and delivered the first n lines
        def count(rs: list[dict[str, Any]]) -> int:
            return sum(len(wire.lines_of(r)) for r in rs if r["t"] == "lines")
        got = count(consume(kafka_bootstrap, f"{topic_prefix}logs", lambda rs: count(rs) >= n,
                            timeout=60))
        assert got >= n, f"{got} of {n} lines shipped"

    log = tmp_path / "train.log"
    append(log, "old 1", "old 2")
    argv = tail_argv(kafka_bootstrap, topic_prefix, tmp_path, log)
    p = start(argv, tmp_path / "agent1.err")
    shipped(2)  # the file is open before it is rotated
    append(log, "old 3")
    os.rename(log, tmp_path / "train.log.1")  # logrotate: rename, then a new file
    append(tmp_path / "train.log.1", "old 4 (written after the rename)")
    append(log, "new 1")
    shipped(5)  # read before the truncation (a copytruncate loses what was not read yet)
    log.write_text("after truncate 1\n")  # copytruncate-style rewrite
    shipped(6)
    err = stop(p, tmp_path / "agent1.err")
    assert b"event=tail_rotated" in err and b"event=tail_truncated" in err
    append(log, "while down")  # the agent is not running
    p = start(argv, tmp_path / "agent2.err")
    shipped(7)
    append(log, "after restart")
    shipped(8)
    stop(p, tmp_path / "agent2.err")

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
