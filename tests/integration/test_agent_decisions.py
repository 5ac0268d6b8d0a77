"""The agent acting on decisions it reads from a real decisions topic (published by the test)."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

from faultwatch import wire
from faultwatch.agents.config import EXIT_BLACKLISTED, EXIT_FAILED_BY_DECISION
from tests.support.agents import FOREVER, decision, publish, start_agent
from tests.support.kafka import consume

pytestmark = pytest.mark.kafka

# Fails on attempt 0 (exit 3), succeeds on later attempts; says which attempt it is.
FLAKY = ("import os, sys, time\n"
         "a = os.environ['FAULTWATCH_ATTEMPT']\n"
         "print('attempt', a, flush=True)\n"
         "time.sleep(0.3)\n"
         "sys.exit(3 if a == '0' else 0)\n")


def test_restart_decision_relaunches_with_next_attempt_once(
        kafka_bootstrap: str, topic_prefix: str, tmp_path: Path) -> None:
    job = "dec-restart"
    slurm = {"SLURM_JOB_ID": "777", "SLURMD_NODENAME": "nx", "SLURM_JOB_NAME": "train"}
    p = start_agent(kafka_bootstrap, topic_prefix, tmp_path, job, FLAKY,
                    "--label", "team=ml", env=slurm)
    assert p.stdout is not None and p.stdout.readline() == b"attempt 0\n"
    time.sleep(1.0)  # the child failed; the agent waits for the decision
    assert p.poll() is None
    restart = decision(job, "restart", ("n1", "n2"), run_id="777")
    publish(kafka_bootstrap, f"{topic_prefix}decisions", restart, restart,  # twice: same id
            decision(job, "restart", ("n1",), attempt=5, run_id="777"))  # another attempt
    out, err = p.communicate(timeout=60)
    assert p.returncode == 0, err.decode()[-3000:]
    assert out == b"attempt 1\n"
    assert err.count(b"event=restart ") == 1
    recs = consume(kafka_bootstrap, f"{topic_prefix}logs",
                   lambda rs: sum(r["t"] == "exit" for r in rs) >= 2)
    starts = [wire.run_start_of(r) for r in recs if r["t"] == "start"]
    assert [s.attempt for s in starts] == [0, 1]
    # One run across the attempts, identified by the scheduler's job.
    assert [(s.run_id, s.run_source) for s in starts] == [("777", "slurm")] * 2
    assert starts[0].scheduler == {"kind": "slurm", "job_id": "777", "node": "nx",
                                   "job_name": "train", "labels": {"team": "ml"}}
    # `faultwatch logs` shows both attempts' lines (each attempt's seq starts at 0 again),
    # each after its attempt's separator, the second naming the restart decision.
    res = subprocess.run([sys.executable, "-m", "faultwatch", "logs", job, "--topic-prefix",
                          topic_prefix, "--bootstrap", kafka_bootstrap, "--json"],
                         capture_output=True, timeout=60)
    rows = [json.loads(x) for x in res.stdout.decode().splitlines()]
    assert [(r["type"], r["attempt"], r["text"]) for r in rows if r["type"] != "exit"] == [
        ("attempt", 0, ""), ("line", 0, "attempt 0"), ("decision", 0, ""),
        ("decision", 5, ""), ("attempt", 1, ""), ("line", 1, "attempt 1")], res
    [second] = [r for r in rows if r["type"] == "attempt" and r["attempt"] == 1]
    assert second["decision"]["id"] == restart.id
    exits = [wire.exit_of(r) for r in recs if r["t"] == "exit"]
    assert [(e.attempt, e.exit_code) for e in exits] == [(0, 3), (1, 0)]


def test_blacklist_naming_this_node_stops_the_child_and_exits_75(
        kafka_bootstrap: str, topic_prefix: str, tmp_path: Path) -> None:
    job = "dec-blacklist"
    p = start_agent(kafka_bootstrap, topic_prefix, tmp_path, job, FOREVER,
                    "--term-grace-s", "2")
    assert p.stdout is not None and p.stdout.readline() == b"running\n"
    publish(kafka_bootstrap, f"{topic_prefix}decisions",
            decision(job, "blacklist", ("n9",)),  # another node: nothing to do here
            decision(job, "blacklist", ("n1",), did="bl-n1"))
    _, err = p.communicate(timeout=30)
    assert p.returncode == EXIT_BLACKLISTED, err.decode()[-3000:]
    assert b"event=blacklisted" in err


def test_fail_decision_stops_a_running_child(kafka_bootstrap: str, topic_prefix: str,
                                             tmp_path: Path) -> None:
    job = "dec-fail"
    p = start_agent(kafka_bootstrap, topic_prefix, tmp_path, job, FOREVER)
    assert p.stdout is not None and p.stdout.readline() == b"running\n"
    publish(kafka_bootstrap, f"{topic_prefix}decisions", decision(job, "fail", ("n2",)))
    _, err = p.communicate(timeout=30)
    assert p.returncode == EXIT_FAILED_BY_DECISION, err.decode()[-3000:]


def test_no_decision_within_the_wait_exits_undecided(
        kafka_bootstrap: str, topic_prefix: str, tmp_path: Path) -> None:
    p = start_agent(kafka_bootstrap, topic_prefix, tmp_path, "dec-none",
                    "import sys; sys.exit(4)", "--decision-wait-s", "2")
    _, err = p.communicate(timeout=30)
    assert p.returncode == 77 and b"event=no_decision" in err, err.decode()[-2000:]
    assert b"command exited with code 4" in err  # the child's own code, reported
    waited = float(re.search(rb"event=no_decision .*waited_s=([0-9.]+)", err)[1])  # type: ignore[index]
    assert 1.9 <= waited <= 10, waited  # the real wait (it printed 0.0)
