"""A real agent's /metrics endpoint under slow clients: loopback by default, reads time out,
a bounded number of threads however many connections idle on it."""

from __future__ import annotations

import socket
import subprocess
import sys
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from faultwatch.kafka import broker as kafka_local
from tests.support.agents import agent_cmd
from tests.support.waiting import wait_until

pytestmark = pytest.mark.kafka

HOLD = "import time; print('up', flush=True); time.sleep(120)"
SLOW_CLIENTS = 300


def threads_of(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("Threads:"):
            return int(line.split()[1])
    raise AssertionError("no Threads: line")


def scrape(port: int) -> bytes | None:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics",  # noqa: S310
                                    timeout=2) as r:
            return bytes(r.read())
    except OSError:
        return None


def listens_on(port: int) -> set[str]:
    """Local addresses of LISTEN sockets on `port` (from /proc/net/tcp, hex)."""
    out = set()
    for line in Path("/proc/net/tcp").read_text().splitlines()[1:]:
        local, state = line.split()[1], line.split()[3]
        ip_hex, port_hex = local.split(":")
        if state == "0A" and int(port_hex, 16) == port:
            out.add(socket.inet_ntoa(bytes.fromhex(ip_hex)[::-1]))
    return out


@pytest.fixture
def agent(kafka_bootstrap: str, topic_prefix: str, tmp_path: Path
          ) -> Iterator[tuple[subprocess.Popen[bytes], int]]:
    port = kafka_local.free_port()
    p = subprocess.Popen(agent_cmd(kafka_bootstrap, topic_prefix, tmp_path, "metrics-job",
                                   sys.executable, "-c", HOLD,
                                   extra=("--metrics-port", str(port))),
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        assert p.stdout is not None and p.stdout.readline() == b"up\n"
        wait_until(lambda: scrape(port), 30, "the first scrape")
        yield p, port
    finally:
        p.terminate()
        p.communicate(timeout=60)


def test_metrics_listen_on_loopback_by_default(
        agent: tuple[subprocess.Popen[bytes], int]) -> None:
    _, port = agent
    assert listens_on(port) == {"127.0.0.1"}


def test_slow_clients_hold_a_bounded_number_of_threads_and_time_out(
        agent: tuple[subprocess.Popen[bytes], int]) -> None:
    proc, port = agent
    before = threads_of(proc.pid)
    body = scrape(port)
    assert body is not None and b"faultwatch_agent_lines_read" in body  # positive control
    slow = []
    for _ in range(SLOW_CLIENTS):  # each sends half a request and then nothing
        s = socket.create_connection(("127.0.0.1", port), timeout=5)
        s.sendall(b"GET /metrics HTTP/1.1\r\nHost: x\r\n")
        slow.append(s)
    try:
        wait_until(lambda: threads_of(proc.pid) > before, 10, "a thread per slow client")
        peak = max(threads_of(proc.pid) for _ in range(20))
        assert peak <= before + 16 + 2, (before, peak)
        # the read timeout frees every slot: a scrape works again while the slow ones idle
        assert wait_until(lambda: scrape(port), 30, "a scrape after the read timeout")
        wait_until(lambda: threads_of(proc.pid) <= before + 1, 30, "threads back")
    finally:
        for s in slow:
            s.close()
