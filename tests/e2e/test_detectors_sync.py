"""Every detector against real processes, real agents and a real processor on Kafka (sync)."""

from __future__ import annotations

import os
import signal
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from faultwatch.agents.exitcodes import EXIT_UNDECIDED
from tests.support.cluster import decisions, processor, wait_processed, wait_processor_ready
from tests.support.processes import torchrun_cmd
from tests.support.scenarios import JOBS, agents, kinds, new_job, policy_file, scenario, wait_for

pytestmark = [pytest.mark.slow, pytest.mark.kafka]

FLOOR_S = 4.0
NODE_LOST_S = 6.0
EXIT_HANG_S = 5.0


@pytest.fixture(scope="module")
def cluster(kafka_bootstrap: str,
            tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, str, float]]:
    prefix = f"det{uuid.uuid4().hex[:8]}."
    d = tmp_path_factory.mktemp("detproc")
    pol = policy_file(d / "policy.yaml", hang_floor_s=FLOOR_S, hang_ceiling_s=60,
                      node_lost_s=NODE_LOST_S, exit_hang_window_s=EXIT_HANG_S, settle_s=1.5,
                      max_restarts=2, enable_restart=True, hang_detection=True,
                      exit_hang_detection=True, restart_backoff_s=0.1)
    log = d / "processor.log"
    with processor(kafka_bootstrap, prefix, log, "--rules", str(pol)) as proc:
        started = time.time()
        wait_processor_ready(kafka_bootstrap, prefix, proc, log)
        yield kafka_bootstrap, prefix, started
        assert proc.poll() is None, f"processor died:\n{log.read_text()[-4000:]}"


def test_adaptive_hang_window_detects_in_seconds(cluster: tuple[str, str, float],
                                                  tmp_path: Path) -> None:
    bootstrap, prefix, _ = cluster
    job = new_job("adaptive")
    with agents(bootstrap, prefix, tmp_path) as a:
        a.start(job, "node-0", scenario("silent", 25, 0.2))
        decs = wait_for(bootstrap, prefix, job, bool, timeout_s=60)
    assert kinds(decs) == [("restart", "hang")], decs
    ev = decs[0]["evidence"]
    assert ev["window"]["basis"] == "adaptive", ev["window"]
    assert FLOOR_S <= ev["window_s"] <= FLOOR_S + 1, ev
    latency = decs[0]["ts"] - ev["silent_since"]
    print(f"\nadaptive hang: window {ev['window_s']}s learned from "
          f"{ev['window']['learned']}, decided {latency:.2f}s after the last line")
    assert latency < ev["window_s"] + 3.0


def test_progress_stall_while_output_flows(cluster: tuple[str, str, float],
                                           tmp_path: Path) -> None:
    bootstrap, prefix, _ = cluster
    job = new_job("stall")
    with agents(bootstrap, prefix, tmp_path) as a:
        a.start(job, "node-0", scenario("stall", 25, 0.2))
        decs = wait_for(bootstrap, prefix, job, bool, timeout_s=60)
    assert kinds(decs) == [("restart", "progress-stall")], decs
    assert decs[0]["evidence"]["stalled_for_s"] >= FLOOR_S


def test_checkpoint_longer_than_the_window_is_no_false_hang(cluster: tuple[str, str, float],
                                                            tmp_path: Path) -> None:
    bootstrap, prefix, _ = cluster
    job = new_job("ckpt")
    with agents(bootstrap, prefix, tmp_path) as a:
        # learned window ~4 s; the checkpoint is silent for 3 x that
        assert a.run(job, "node-0", scenario("checkpoint", 25, 0.2, 3 * FLOOR_S)) == 0
    wait_processed(bootstrap, prefix)  # positive control: the processor read the whole job
    assert decisions(bootstrap, prefix, job) == []


def test_exit_hang_two_agents_one_finishes(cluster: tuple[str, str, float],
                                           tmp_path: Path) -> None:
    bootstrap, prefix, _ = cluster
    job = new_job("exithang")
    with agents(bootstrap, prefix, tmp_path) as a:
        a.start(job, "node-0", scenario("steady", 5, 0.2))
        a.start(job, "node-1", scenario("forever", 0.3))
        decs = wait_for(bootstrap, prefix, job, bool, timeout_s=60)
    assert kinds(decs) == [("restart", "exit-hang")], decs
    ev = decs[0]["evidence"]
    assert ev["finished_nodes"] == ["node-0"] and ev["still_running"] == ["node-1"]


def test_node_lost_when_an_agent_is_sigkilled(cluster: tuple[str, str, float],
                                              tmp_path: Path) -> None:
    bootstrap, prefix, started = cluster
    job = new_job("lost")
    with agents(bootstrap, prefix, tmp_path) as a:
        a.start(job, "node-0", scenario("forever", 0.3))
        victim = a.start(job, "node-1", scenario("forever", 0.3))
        time.sleep(3.0)
        os.kill(victim.pid, signal.SIGKILL)  # the agent only: its heartbeats stop
        killed = time.time()
        decs = wait_for(bootstrap, prefix, job, bool, timeout_s=60)
    assert kinds(decs) == [("restart", "node-lost")], decs
    ev = decs[0]["evidence"]
    assert list(ev["lost_nodes"]) == ["node-1"] and ev["blacklist_candidates"] == ["node-1"]
    # decided on processor time, after the window (and the grace after assignment)
    assert decs[0]["ts"] - killed >= NODE_LOST_S - 2.5
    assert decs[0]["ts"] - max(killed, started + NODE_LOST_S + 5) < NODE_LOST_S + 6


def test_restart_budget(cluster: tuple[str, str, float], tmp_path: Path) -> None:
    bootstrap, prefix, _ = cluster
    job = new_job("budget")
    err = "RuntimeError: Socket Timeout"
    with agents(bootstrap, prefix, tmp_path) as a:
        for attempt in range(3):
            assert a.run(job, "node-0", scenario("fail", err), attempt=attempt) == EXIT_UNDECIDED
            wait_for(bootstrap, prefix, job, lambda d, n=attempt: len(d) > n, timeout_s=30)
    decs = decisions(bootstrap, prefix, job)
    assert [d["action"] for d in decs] == ["restart", "restart", "fail"], decs
    assert "budget exhausted (2/2)" in decs[2]["reason"]["message"]
    assert [d["budgets"]["restarts_used"] for d in decs] == [1, 2, 2]


def test_mismatched_collectives_on_gloo(cluster: tuple[str, str, float],
                                        tmp_path: Path) -> None:
    """rank 0 all_reduce vs rank 1 broadcast: both block silently until gloo's timeout
    (8 s here); the adaptive window decides a hang first, and only one decision is made."""
    bootstrap, prefix, _ = cluster
    job = new_job("mismatch")
    with agents(bootstrap, prefix, tmp_path) as a:
        p = a.start(job, "node-0", torchrun_cmd(2, JOBS / "mismatch_gloo.py"),
                    FW_PG_TIMEOUT_S="12")
        decs = wait_for(bootstrap, prefix, job, bool, timeout_s=90)
        p.wait(60)
    wait_processed(bootstrap, prefix)  # every record processed: nothing else may follow
    decs = decisions(bootstrap, prefix, job)
    assert kinds(decs) == [("restart", "hang")], decs
    ev = decs[0]["evidence"]
    assert ev["silent_for_s"] < 12.0  # before gloo's own timeout
    assert "entering mismatched collective" in " ".join(sum(ev["last_lines"].values(), []))
