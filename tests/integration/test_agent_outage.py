"""Broker stopped 60 s mid-run: every line arrives once after dedupe; the child never waits."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from faultwatch import wire
from faultwatch.kafka import broker as kafka_broker
from tests.support.agents import agent_cmd, has_exit
from tests.support.kafka import consume

pytestmark = [pytest.mark.kafka, pytest.mark.slow]

OUTAGE_S = 60.0

# Writes 1000 lines/s with one os.write each plus a 20k-line burst every 10 s, until the stop
# file exists; prints its write-latency figures (seconds) as JSON on stderr at the end.
WRITER = r"""
import json, os, sys, time
stop = sys.argv[1]
lat, i, paced, t0 = [], 0, 0, time.monotonic()
burst_at = t0 + 3
def w(n):
    global i
    for _ in range(n):
        line = b"seq %08d %s\n" % (i, b"y" * 60)
        a = time.perf_counter(); os.write(1, line); lat.append(time.perf_counter() - a)
        i += 1
while not os.path.exists(stop):
    w(10); paced += 10
    if time.monotonic() >= burst_at:
        w(20000); burst_at += 10
    time.sleep(max(0.0, t0 + paced / 1000 - time.monotonic()))
lat.sort()
print(json.dumps({"lines": i, "p99": lat[int(0.99 * len(lat))], "max": lat[-1]}), file=sys.stderr)
"""




def stats_json(stderr: bytes) -> dict[str, Any]:
    for raw in reversed(stderr.splitlines()):
        if raw.startswith(b"{"):
            return dict(json.loads(raw))
    raise AssertionError(stderr.decode()[-3000:])


def test_broker_down_60s_mid_run_exactly_once_and_child_never_blocked(
        own_broker: tuple[str, Path, int], topic_prefix: str, tmp_path: Path) -> None:
    bootstrap, data, port = own_broker
    stop = tmp_path / "stop"
    argv = agent_cmd(bootstrap, topic_prefix, tmp_path / "spool", "outage", sys.executable,
                     "-c", WRITER, str(stop),
                     extra=("--exit-flush-timeout-s", "90", "--no-follow-decisions"))
    agent = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        time.sleep(5)
        t_down = time.monotonic()
        kafka_broker.down(data, port)
        time.sleep(max(0.0, OUTAGE_S - (time.monotonic() - t_down)))
        outage = time.monotonic() - t_down
        kafka_broker.up(port=port, data_dir=data)
        time.sleep(3)
        stop.touch()
        _, err = agent.communicate(timeout=150)
    finally:
        if agent.poll() is None:
            agent.kill()
            agent.wait()
    assert agent.returncode == 0, err.decode()[-3000:]
    assert outage >= OUTAGE_S
    child = stats_json(err)
    n = child["lines"]
    assert n > 60_000  # the child kept writing at its pace through the outage
    assert b"event=broker_down" in err and b"event=broker_up" in err
    assert b"flush_timeout" not in err

    recs = consume(bootstrap, f"{topic_prefix}logs", has_exit, timeout=60)
    seen: dict[int, int] = {}
    for r in recs:
        if r["t"] == "lines":
            for ln in wire.lines_of(r):
                seen[ln.seq] = seen.get(ln.seq, 0) + 1
    assert sorted(seen) == list(range(n)), f"missing {n - len(seen)} of {n}"
    dups = sum(c - 1 for c in seen.values())
    hbs = [r for r in recs if r["t"] == "hb"]
    assert any(h["stats"]["broker_up"] is False for h in hbs)  # spooled during the outage
    assert not any((tmp_path / "spool").rglob("*.seg"))  # all acked, spool released
    # Never blocked: a child blocked on a full pipe would wait for the whole outage.
    print(f"\noutage {outage:.1f}s lines {n} duplicates {dups} "
          f"child write p99 {child['p99'] * 1e6:.1f}us max {child['max'] * 1e3:.1f}ms")
    assert child["max"] < 0.5, child
    assert child["p99"] < 0.005, child
