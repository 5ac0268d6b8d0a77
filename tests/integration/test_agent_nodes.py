"""--wait-for-nodes: agents of one job hold their launch until N nodes said hello; timeout."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest

from faultwatch.agents.config import EXIT_NODES_TIMEOUT
from tests.support.agents import agent_cmd
from tests.support.kafka import consume

pytestmark = pytest.mark.kafka

LAUNCHED = "import time; print('launched', time.time(), flush=True)"


def node_cmd(bootstrap: str, prefix: str, tmp: Path, job: str, node: str,
             *extra: str) -> list[str]:
    argv = agent_cmd(bootstrap, prefix, tmp / node, job, sys.executable, "-c", LAUNCHED,
                     extra=("--no-follow-decisions", *extra))
    argv[argv.index("--node") + 1] = node
    return argv


def test_launch_waits_until_both_nodes_are_up(kafka_bootstrap: str, topic_prefix: str,
                                              tmp_path: Path) -> None:
    job = "skew"
    first = subprocess.Popen(node_cmd(kafka_bootstrap, topic_prefix, tmp_path, job, "n1",
                                      "--wait-for-nodes", "2"),
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    time.sleep(3.0)  # n2's image pull took a while
    t_second = time.time()
    second = subprocess.run(node_cmd(kafka_bootstrap, topic_prefix, tmp_path, job, "n2",
                                     "--wait-for-nodes", "2"),
                            capture_output=True, timeout=60)
    out1, err1 = first.communicate(timeout=60)
    assert first.returncode == 0 and second.returncode == 0, (err1 + second.stderr).decode()
    launched1 = float(out1.split()[1])
    assert launched1 >= t_second  # n1 launched only after n2 came up
    assert b"event=nodes_up" in err1 and b"skew_s=" in err1
    recs = consume(kafka_bootstrap, f"{topic_prefix}logs",
                   lambda rs: sum(r["t"] == "exit" for r in rs) >= 2)
    hellos = [r for r in recs if r["t"] == "note" and r["kind"] == "hello"]
    assert sorted(h["node"] for h in hellos) == ["n1", "n2"]
    assert hellos[1]["ts"] - hellos[0]["ts"] >= 2.5  # the skew is visible in the stream
    starts = sorted((r for r in recs if r["t"] == "start"), key=lambda r: r["node"])
    assert [s["node"] for s in starts] == ["n1", "n2"]


def test_nodes_that_never_come_up_time_out_with_a_clear_message(
        kafka_bootstrap: str, topic_prefix: str, tmp_path: Path) -> None:
    res = subprocess.run(node_cmd(kafka_bootstrap, topic_prefix, tmp_path, "lonely", "n1",
                                  "--wait-for-nodes", "3", "--wait-for-nodes-timeout-s", "2"),
                         capture_output=True, timeout=60)
    assert res.returncode == EXIT_NODES_TIMEOUT, res.stderr.decode()[-2000:]
    assert res.stdout == b""  # never launched
    assert b"only 1 of 3 nodes of job 'lonely' came up within 2s (seen: n1)" in res.stderr
