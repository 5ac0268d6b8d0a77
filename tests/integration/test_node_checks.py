"""Checks that check, on the real broker with real agents (issue 10): the agent re-runs its
checks before relaunching after a failure and a check failing then is a hardware verdict for
that node (in `faultwatch logs`, in the registry); nodes whose checks differ for real (the
training command runs under another interpreter) are compared and the odd one is named."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

from faultwatch.agents.config import EXIT_BLACKLISTED
from faultwatch.registry.gate import CHECK_FAILED_RULE, CHECK_ODD_RULE
from tests.support.cluster import decisions, node_records, processor, wait_decisions, wait_event
from tests.support.processes import faultwatch_exe, job_env
from tests.support.waiting import wait_until

pytestmark = pytest.mark.kafka

# attempt 0: the scratch directory is replaced by a file (the mount went away), then a
# retryable error; attempt 1: a long run (the blacklist must stop it)
LOSE_SCRATCH = """import os, shutil, sys, time
d = sys.argv[1]
if os.environ["FAULTWATCH_ATTEMPT"] == "0":
    shutil.rmtree(d)
    open(d, "w").write("the scratch mount went away")
    print("RuntimeError: Socket Timeout", file=sys.stderr, flush=True)
    sys.exit(1)
for i in range(120):
    print("step", i, flush=True)
    time.sleep(0.5)
"""
STEPS = "import time\nfor i in range({n}):\n    print('step', i, flush=True)\n    time.sleep(0.5)\n"
SYSTEM_PYTHON = "/usr/bin/python3"  # another interpreter: other Python version, no torch


def _agent(bootstrap: str, prefix: str, tmp: Path, job: str, node: str, cmd: list[str],
           *flags: str, env: dict[str, str] | None = None) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [faultwatch_exe(), "agent", "--bootstrap", bootstrap, "--topic-prefix", prefix,
         "--job", job, "--node", node, "--run-id", f"run-{job}", "--heartbeat-s", "1",
         "--spool-dir", str(tmp / f"spool-{node}"), "--follow-decisions",
         "--decision-wait-s", "30", "--bootcheck", "--no-bootcheck-allreduce", *flags,
         "--", *cmd],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=job_env(**(env or {})))


def _logs(bootstrap: str, prefix: str, job: str) -> str:
    res = subprocess.run([faultwatch_exe(), "logs", "--bootstrap", bootstrap, "--topic-prefix",
                          prefix, job], capture_output=True, text=True, timeout=60,
                         env=job_env())
    assert res.returncode == 0, res.stderr
    return res.stdout


def test_a_check_failing_after_a_failure_blacklists_and_quarantines_the_node(
        kafka_bootstrap: str, topic_prefix: str, tmp_path: Path) -> None:
    tag = uuid.uuid4().hex[:6]
    job, node = f"lose-scratch-{tag}", f"n-{tag}"
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    log = tmp_path / "processor.log"
    with processor(kafka_bootstrap, topic_prefix, log, "--settle-s", "1") as proc:
        wait_event(log, "partitions_assigned", 90, lambda e: e.get("partitions") != "-",
                   proc=proc)
        agent = _agent(kafka_bootstrap, topic_prefix, tmp_path, job, node,
                       [sys.executable, "-c", LOSE_SCRATCH, str(scratch)],
                       "--bootcheck-path", str(scratch))
        try:
            out, err = agent.communicate(timeout=150)
        finally:
            if agent.poll() is None:
                agent.kill()
        assert agent.returncode == EXIT_BLACKLISTED, err[-3000:]
        assert out.count("step") < 60, out  # stopped by the decision, not finished
        decs = wait_decisions(kafka_bootstrap, topic_prefix, job, 2)
        assert [(d["action"], d["attempt"]) for d in decs] == [("restart", 0),
                                                               ("blacklist", 1)], decs
        bl = decs[1]
        assert bl["targets"]["nodes"] == [node] and bl["reason"]["rule"] == CHECK_FAILED_RULE
        line = bl["evidence"]["first_error"]["line"]
        assert f"bootcheck failed on {node}: disk:{scratch}" in line, line
        assert "NotADirectoryError" in line or "FileExistsError" in line, line
        # the checks ran at the start and again before the relaunch; both are in the logs
        shown = [x for x in _logs(kafka_bootstrap, topic_prefix, job).splitlines()
                 if "bootcheck (" in x]
        assert len(shown) == 2, shown
        assert "bootcheck (start): ok" in shown[0] and f"disk:{scratch} ok" in shown[0]
        assert "bootcheck (restart): FAILED" in shown[1] and "NotADirectoryError" in shown[1]
        # and the node is quarantined fleet-wide
        reg = wait_until(lambda: node_records(kafka_bootstrap, topic_prefix), 30,
                         f"node {node} quarantined in the registry", interval_s=0.5,
                         until=lambda r: r.get(node, {}).get("state") == "quarantined")
        assert reg[node]["reasons"][-1]["rule"] == CHECK_FAILED_RULE
        assert proc.poll() is None, log.read_text()[-3000:]


@pytest.mark.skipif(not os.access(SYSTEM_PYTHON, os.X_OK), reason="needs /usr/bin/python3")
def test_the_node_whose_training_interpreter_differs_is_named(
        kafka_bootstrap: str, topic_prefix: str, tmp_path: Path) -> None:
    probe = subprocess.run([SYSTEM_PYTHON, "-c", "import sys; print(sys.version.split()[0])"],
                           capture_output=True, text=True, check=True).stdout.strip()
    ours = sys.version.split()[0]
    assert probe != ours, "the test needs two interpreters of different Python versions"
    tag = uuid.uuid4().hex[:6]
    job, n0, n1 = f"two-envs-{tag}", f"a-{tag}", f"b-{tag}"
    log = tmp_path / "processor.log"
    with processor(kafka_bootstrap, topic_prefix, log, "--settle-s", "1") as proc:
        wait_event(log, "partitions_assigned", 90, lambda e: e.get("partitions") != "-",
                   proc=proc)
        agents = {
            n0: _agent(kafka_bootstrap, topic_prefix, tmp_path, job, n0,
                       [sys.executable, "-c", STEPS.format(n=30)], "--nnodes", "2",
                       env={"NODE_RANK": "0"}),
            n1: _agent(kafka_bootstrap, topic_prefix, tmp_path, job, n1,
                       [SYSTEM_PYTHON, "-c", STEPS.format(n=120)], "--nnodes", "2",
                       env={"NODE_RANK": "1"})}
        try:
            out1, err1 = agents[n1].communicate(timeout=150)
        finally:
            for a in agents.values():
                if a.poll() is None:
                    a.kill()
        assert agents[n1].returncode == EXIT_BLACKLISTED, err1[-3000:]
        decs = wait_decisions(kafka_bootstrap, topic_prefix, job, 1)
        bl = [d for d in decs if d["action"] == "blacklist"]
        assert len(bl) == 1 and bl[0]["targets"]["nodes"] == [n1], decs
        matches = {m["rule"]: m for m in bl[0]["evidence"]["matches"]}
        odd = [m for m in bl[0]["evidence"]["matches"] if m["rule"] == CHECK_ODD_RULE]
        py = next(m["line"] for m in odd if "python is" in m["line"])
        assert f"python is '{probe}'" in py and f"'{ours}'" in py, odd
        assert "rank 0" in py  # two nodes: the rank-0 node is the reference
        # the other interpreter has no torch at all: not a failure by itself (a job may not
        # use torch), but unlike the reference node
        lines = " | ".join(m["line"] for m in bl[0]["evidence"]["matches"])
        assert "torch is 'not installed'" in lines, lines
        assert CHECK_FAILED_RULE not in matches, matches
        assert all(m["node"] == n1 for m in bl[0]["evidence"]["matches"])
        assert not any(n0 in d["targets"]["nodes"] and d["action"] == "blacklist"
                       for d in decisions(kafka_bootstrap, topic_prefix, job))
        assert proc.poll() is None, log.read_text()[-3000:]
        json.dumps(decs)
