"""The node agent against a real broker: lines, lifecycle, bad input, signals, spool replay."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from faultwatch import wire
from faultwatch.agents.exitcodes import EXIT_UNDECIDED
from faultwatch.core.events import INVALID_UTF8, TRUNCATED, Line
from tests.support.agents import UNREACHABLE, agent_cmd, has_exit, run_agent
from tests.support.kafka import consume

pytestmark = pytest.mark.kafka


def lines(recs: list[dict[str, Any]], stream: str | None = None) -> list[Line]:
    out = [ln for r in recs if r["t"] == "lines" for ln in wire.lines_of(r)]
    return [ln for ln in out if stream is None or ln.stream == stream]


def test_lines_start_heartbeats_exit(kafka_bootstrap: str, topic_prefix: str,
                                     tmp_path: Path) -> None:
    n = 3000
    script = (f"import sys, time\n"
              f"for i in range({n}): print(f'line {{i}} ' + 'x' * (i % 50))\n"
              f"sys.stdout.flush(); print('to stderr', file=sys.stderr); time.sleep(0.6)\n"
              f"sys.exit(3)\n")
    res = run_agent(agent_cmd(kafka_bootstrap, topic_prefix, tmp_path, "j1",
                              sys.executable, "-c", script))
    # not following decisions: "undecided" (77), never the child's own 3 (reported instead)
    assert res.returncode == EXIT_UNDECIDED, res.stderr.decode()[-2000:]
    assert b"verdict undecided (exit 77); command exited with code 3" in res.stderr
    expected = "".join(f"line {i} " + "x" * (i % 50) + "\n" for i in range(n)).encode()
    assert res.stdout == expected  # the tee is byte-exact
    assert b"to stderr\n" in res.stderr

    recs = consume(kafka_bootstrap, f"{topic_prefix}logs", has_exit)
    kinds = [r["t"] for r in recs]
    assert kinds[0] == "start" and kinds[-1] == "exit", kinds[:3]
    start = wire.run_start_of(recs[0])
    assert start.job == "j1" and start.node == "n1" and start.pid > 0
    assert start.cmd[0] == sys.executable and start.agent_version
    out = lines(recs, "stdout")
    assert sorted(ln.seq for ln in out) == list(range(n))  # every seq exactly once
    assert [ln.text for ln in out] == expected.decode().splitlines()
    assert [ln.text for ln in lines(recs, "stderr")] == ["to stderr"]
    hbs = [r for r in recs if r["t"] == "hb"]
    assert len(hbs) >= 2
    assert hbs[0]["alive"] is True and hbs[0]["started_ts"] is not None
    assert hbs[-1]["stats"]["lines_read"] == n + 1
    assert hbs[-2]["last_output_ts"] is not None
    ex = wire.exit_of(recs[-1])
    assert ex.exit_code == 3 and ex.signal is None
    assert {r["run_id"] for r in recs if "run_id" in r} == {start.run_id}
    assert not any(tmp_path.rglob("*.seg"))  # everything acked: the spool is empty


def test_child_killed_by_sigkill_is_137(kafka_bootstrap: str, topic_prefix: str,
                                        tmp_path: Path) -> None:
    res = run_agent(agent_cmd(kafka_bootstrap, topic_prefix, tmp_path, "j2",
                              "sh", "-c", "echo before; kill -9 $$"))
    assert res.returncode == EXIT_UNDECIDED and res.stdout == b"before\n"
    assert b"command was killed by SIGKILL (code 137)" in res.stderr
    recs = consume(kafka_bootstrap, f"{topic_prefix}logs", has_exit)
    ex = wire.exit_of([r for r in recs if r["t"] == "exit"][0])
    assert (ex.exit_code, ex.signal) == (137, 9)
    assert [ln.text for ln in lines(recs)] == ["before"]


def test_invalid_utf8_and_10mb_line(kafka_bootstrap: str, topic_prefix: str,
                                    tmp_path: Path) -> None:
    script = ("import sys\n"
              "w = sys.stdout.buffer.write\n"
              "w(b'bad \\xff\\xfe bytes\\n')\n"
              "w(b'y' * (10 * 1024 * 1024) + b'\\n')\n"
              "w('caf\\u00e9 ok\\n'.encode())\n"
              "w(b'\\r 10%\\r 20%\\r100%\\n')\n")
    res = run_agent(agent_cmd(kafka_bootstrap, topic_prefix, tmp_path, "j3",
                              sys.executable, "-c", script))
    assert res.returncode == 0, res.stderr.decode()[-2000:]
    assert res.stdout == (b"bad \xff\xfe bytes\n" + b"y" * (10 * 1024 * 1024) + b"\n"
                          + "café ok\n".encode() + b"\r 10%\r 20%\r100%\n")  # teed unchanged
    recs = consume(kafka_bootstrap, f"{topic_prefix}logs", has_exit)
    got = lines(recs, "stdout")
    assert got[0].flags == INVALID_UTF8 and "\ufffd" in got[0].text
    assert got[1].flags == TRUNCATED and got[1].orig_len == 10 * 1024 * 1024
    assert len(got[1].text) == 65536
    assert got[2].text == "café ok" and got[2].flags == 0
    assert [ln.text for ln in got[3:]][-1] == "100%"
    assert [ln.seq for ln in got] == list(range(len(got)))


def test_sigterm_to_agent_is_forwarded_and_escalated(kafka_bootstrap: str, topic_prefix: str,
                                                     tmp_path: Path) -> None:
    script = ("import signal, time\n"
              "signal.signal(signal.SIGTERM, lambda *a: print('got TERM', flush=True))\n"
              "print('ready', flush=True)\n"
              "while True: time.sleep(0.05)\n")
    argv = agent_cmd(kafka_bootstrap, topic_prefix, tmp_path, "j4", sys.executable, "-c",
                     script, extra=("--term-grace-s", "1"))
    p = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert p.stdout is not None
    assert p.stdout.readline() == b"ready\n"
    t0 = time.monotonic()
    p.send_signal(signal.SIGTERM)
    rc = p.wait(30)
    # the agent was stopped by SIGTERM: 143 (the child, SIGKILLed after the grace, was 137)
    assert rc == 128 + signal.SIGTERM and 0.9 < time.monotonic() - t0 < 15
    assert p.stdout.read() == b"got TERM\n"
    recs = consume(kafka_bootstrap, f"{topic_prefix}logs", has_exit)
    assert wire.exit_of([r for r in recs if r["t"] == "exit"][0]).signal == 9


def test_broker_down_never_blocks_the_child(tmp_path: Path) -> None:
    n = 200_000
    script = ("import sys, time\nt = time.monotonic()\n"
              f"for i in range({n}): print('line', i)\n"
              "sys.stdout.flush(); print(f'took {time.monotonic() - t:.3f}', file=sys.stderr)\n")
    t0 = time.monotonic()
    res = run_agent(agent_cmd(UNREACHABLE, "fw.", tmp_path, "j5", sys.executable, "-c",
                              script, extra=("--exit-flush-timeout-s", "1")))
    assert res.returncode == 0
    assert res.stdout.count(b"\n") == n
    # A child blocked on a full pipe would never finish while the broker is unreachable;
    # finishing at all proves the reader never waited on Kafka. The bounds are generous
    # (a loaded 2-core CI box): stall figures are measured in bench/agent_throughput.py.
    took = float(res.stderr.split(b"took ")[1].split()[0])
    assert took < 30 and time.monotonic() - t0 < 60
    assert b"event=flush_timeout" in res.stderr
    assert any(tmp_path.rglob("*.seg"))  # unsent records stay spooled for replay


def test_spool_replay_after_agent_sigkill(kafka_bootstrap: str, topic_prefix: str,
                                          tmp_path: Path) -> None:
    # 1. broker unreachable: nothing can be acked; SIGKILL the agent mid-run.
    n = 500
    script = ("import os, sys, time\n"
              f"for i in range({n}): print('spooled', i)\n"
              "print('pid', os.getpid(), flush=True)\n"
              "time.sleep(60)\n")
    argv = agent_cmd(UNREACHABLE, topic_prefix, tmp_path, "j6", sys.executable, "-c", script)
    p = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
    assert p.stdout is not None
    child_pid = 0
    for raw in p.stdout:
        if raw.startswith(b"pid "):
            child_pid = int(raw.split()[1])
            break
    time.sleep(0.5)  # the batcher's linger (20 ms) has passed: all lines are spooled
    p.kill()
    p.wait(10)
    os.killpg(child_pid, signal.SIGKILL)  # the child has its own process group
    assert any(tmp_path.rglob("*.seg"))
    # 2. same spool, real broker: a flush-only agent delivers what was left.
    argv = agent_cmd(kafka_bootstrap, topic_prefix, tmp_path, "j6", extra=("--flush",))
    res = run_agent(argv[:-1])
    assert res.returncode == 0, res.stderr.decode()[-2000:]
    assert b"event=spool_replay" in res.stderr
    recs = consume(kafka_bootstrap, f"{topic_prefix}logs",
                   lambda rs: len(lines(rs)) >= n + 1)
    assert recs[0]["t"] == "start"
    assert [ln.text for ln in lines(recs)] == [f"spooled {i}" for i in range(n)] + [
        f"pid {child_pid}"]
    assert not any(tmp_path.rglob("*.seg"))
