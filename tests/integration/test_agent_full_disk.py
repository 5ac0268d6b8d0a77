"""A full spool disk (a real size-limited tmpfs): heartbeats and lifecycle records keep
flowing from memory, ordinary lines are dropped and counted in gap notices that reach the
logs topic, and every line is either delivered or counted."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from faultwatch import wire
from tests.support.agents import agent_cmd, has_exit
from tests.support.kafka import consume

pytestmark = pytest.mark.kafka

N_LINES = 3000
# Writes N_LINES lines over about 3 s, then exits 0.
WRITER = (f"import sys, time\n"
          f"for i in range({N_LINES}):\n"
          f"    print('line', i, 'x' * 40)\n"
          f"    if i % 100 == 0: sys.stdout.flush(); time.sleep(0.1)\n")


@pytest.fixture
def full_disk(tmp_path: Path) -> Iterator[Path]:
    """A 1 MiB tmpfs filled to the last byte (needs root, as on our test machines)."""
    mnt = tmp_path / "disk"
    mnt.mkdir()
    res = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(mnt)],
                         capture_output=True)
    if res.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {res.stderr.decode().strip()}")
    try:
        fd = os.open(mnt / "filler", os.O_WRONLY | os.O_CREAT, 0o600)
        try:
            while True:
                os.write(fd, b"\0" * 4096)
        except OSError:
            pass
        finally:
            os.close(fd)
        assert os.statvfs(mnt).f_bavail == 0
        yield mnt
    finally:
        subprocess.run(["umount", "-l", str(mnt)], check=False)


def test_full_spool_disk_keeps_heartbeats_and_counts_every_dropped_line(
        kafka_bootstrap: str, topic_prefix: str, full_disk: Path) -> None:
    argv = agent_cmd(kafka_bootstrap, topic_prefix, full_disk / "spool", "fulldisk",
                     sys.executable, "-c", WRITER)
    res = subprocess.run(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, timeout=90)
    err = res.stderr.decode()
    assert res.returncode == 0, err[-3000:]

    recs = consume(kafka_bootstrap, f"{topic_prefix}logs", has_exit)
    kinds = [r["t"] for r in recs]
    assert "start" in kinds, kinds
    exits = [wire.exit_of(r) for r in recs if r["t"] == "exit"]
    assert [(e.exit_code, e.signal) for e in exits] == [(0, None)]
    hbs = [wire.heartbeat_of(r) for r in recs if r["t"] == "hb"]
    span = max(h.ts for h in hbs) - min(h.ts for h in hbs)
    assert len(hbs) >= 8 and span >= 2.0, (len(hbs), span)  # every 0.2 s through the run
    gaps = [r for r in recs if r["t"] == "note" and r.get("kind") == "gap"]
    assert gaps and all(g["data"]["reason"] == "spool_write_failed" for g in gaps), gaps
    dropped = sum(int(g["data"]["dropped_lines"]) for g in gaps)
    delivered = sum(len(wire.lines_of(r)) for r in recs if r["t"] == "lines")
    assert dropped > 0
    assert delivered + dropped == N_LINES, (delivered, dropped)
    assert err.count("event=spool_write_failed") == 1, err[-3000:]
    assert err.count("event=spool_write_drops") <= len(gaps)
