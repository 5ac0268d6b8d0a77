"""The blast-radius guard with real agents frozen together (SIGSTOP) and thawed, on the real
broker and a real `faultwatch process` (issue 29 item 1): 16 jobs whose agents stop
reporting together get one notice and no action; a lone lost node before and after is
decided at once (the positive controls of the same run)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

from tests.support.cluster import (
    agent_cmd,
    decisions,
    events,
    metric_value,
    processor,
    wait_decisions,
    wait_event,
    wait_processor_ready,
)
from tests.support.processes import job_env
from tests.support.waiting import wait_until

pytestmark = [pytest.mark.slow, pytest.mark.kafka, pytest.mark.timeout(900)]

TRAIN = "import time\nwhile True:\n    print('step', flush=True)\n    time.sleep(0.5)\n"
FLEET = 16
LOST_S = 10.0


def test_fleet_freeze_is_held_with_one_notice_and_a_lone_loss_is_decided(
        kafka_bootstrap: str, topic_prefix: str, tmp_path: Path) -> None:
    log = tmp_path / "processor.log"
    run = uuid.uuid4().hex[:6]
    jobs = [f"storm-{run}-{i}" for i in range(FLEET + 1)]
    lone, fleet = jobs[0], jobs[1:]
    agents: dict[str, subprocess.Popen[bytes]] = {}
    with processor(kafka_bootstrap, topic_prefix, log, "--node-lost-s", str(LOST_S),
                   "--hang-floor-s", str(LOST_S), "--metrics-port", "0",
                   env={"FAULTWATCH_METRICS_LOG_S": "1"}) as proc:  # every report
        wait_processor_ready(kafka_bootstrap, topic_prefix, proc, log)
        try:
            for j in jobs:
                spool = tmp_path / j
                agents[j] = subprocess.Popen(
                    agent_cmd(kafka_bootstrap, topic_prefix, j, f"n-{j}",  # a node each
                              [sys.executable, "-c", TRAIN], "--spool-dir", str(spool)),
                    stdout=subprocess.DEVNULL, stderr=open(tmp_path / f"{j}.log", "wb"),
                    env=job_env())
            # every job started: the worker tracks them all
            wait_event(log, "processor_metrics", 120,
                       lambda e: int(e.get("jobs_active", 0)) >= len(jobs), proc=proc)
            assert all(a.poll() is None for a in agents.values())
            # positive control 1: one node of 17 freezes -> node-lost, at once
            os.kill(agents[lone].pid, signal.SIGSTOP)
            got = wait_decisions(kafka_bootstrap, topic_prefix, lone, 1, timeout_s=120)
            assert [(d["action"], d["reason"]["kind"]) for d in got] == \
                [("restart", "node-lost")], got
            os.kill(agents[lone].pid, signal.SIGCONT)
            # the fleet freezes together: held, one notice
            for j in fleet:
                os.kill(agents[j].pid, signal.SIGSTOP)
            tripped = wait_event(log, "fleet_storm_tripped", 120, proc=proc)
            print("tripped:", tripped)
            assert int(tripped["jobs"]) >= FLEET
            assert wait_decisions(kafka_bootstrap, topic_prefix, "(fleet)", 1, timeout_s=60)
            # each frozen job's node-lost comes due (and is held) within a tick or two of the
            # trip, not all at once: thaw them once the guard holds them all
            wait_until(lambda: metric_value(log, "faultwatch_fleet_storm_held_jobs"), 60,
                       "the guard holding every frozen job",
                       until=lambda v: v is not None and v >= FLEET)
            for j in fleet:
                os.kill(agents[j].pid, signal.SIGCONT)
            ended = wait_event(log, "fleet_storm_ended", 120, proc=proc)
            print("ended:", ended)
            assert int(ended["returned"]) == FLEET and int(ended["lapsed"]) == 0
            # positive control 2, after the episode (and past a hang window after the thaw):
            # one of the fleet freezes alone -> node-lost again
            again = fleet[0]
            os.kill(agents[again].pid, signal.SIGSTOP)
            got = wait_decisions(kafka_bootstrap, topic_prefix, again, 1, timeout_s=120)
            assert [(d["action"], d["reason"]["kind"]) for d in got] == \
                [("restart", "node-lost")], got
            os.kill(agents[again].pid, signal.SIGCONT)
            # every decision the worker published (its `decision` lines), up to now
            acted = [(e["job"], e["kind"]) for e in events(log, "decision")
                     if e["job"] in fleet and e["kind"] != "diagnose"]
            print("decisions of the frozen fleet:", acted)
            assert acted == [(again, "node-lost")], acted
            notices = decisions(kafka_bootstrap, topic_prefix, "(fleet)")
            print("notices:", [n["reason"]["message"] for n in notices])
            assert len(notices) == 1 and notices[0]["reason"]["kind"] == "fleet-storm"
            assert notices[0]["action"] == "notify"
        finally:
            for a in agents.values():
                try:
                    os.kill(a.pid, signal.SIGCONT)
                    a.terminate()
                except ProcessLookupError:
                    pass
            for a in agents.values():
                try:
                    a.wait(20)
                except subprocess.TimeoutExpired:
                    a.kill()
