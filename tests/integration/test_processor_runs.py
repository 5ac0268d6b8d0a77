"""Run identity through a real processor (issue 8 cases 2, 7 and 14): a reused job name is
decided afresh, a record claiming an absurd attempt moves nothing, a stray record makes no
phantom job. Records are produced as agents write them, so each case is exact."""

from __future__ import annotations

import asyncio
import time
import uuid
from pathlib import Path

import pytest

from faultwatch import wire
from faultwatch.core.events import Exit, Heartbeat, Line, RunStart
from tests.support.cluster import decisions, processor, wait_decisions, wait_event, wait_processed
from tests.support.kafka import produce_records

pytestmark = pytest.mark.kafka

RETRYABLE = "RuntimeError: Socket Timeout"  # built-in retryable (c10d store)
FATAL = "ModuleNotFoundError: No module named 'tensorboardx'"  # built-in fatal


def _job(name: str) -> str:
    return f"{name}-{uuid.uuid4().hex[:6]}"


def _attempt(job: str, run: str, attempt: int, t: float, error: str | None, code: int,
             source: str = "generated") -> list[tuple[bytes, bytes]]:
    """What one agent ships for one attempt: run-start, lines, heartbeat, exit."""
    key = wire.log_key(job, "n0")
    lines = [Line("stdout", 0, t + 0.1, "step 1")]
    if error is not None:
        lines.append(Line("stderr", 1, t + 0.2, error))
    return [(key, wire.encode_run_start(RunStart(job, attempt, "n0", t, run_id=run,
                                                 run_source=source))),
            (key, wire.encode_lines(job, attempt, "n0", run, lines)),
            (key, wire.encode_heartbeat(Heartbeat(job, attempt, "n0", t + 0.3, True, t + 0.2,
                                                  t, run_id=run))),
            (key, wire.encode_exit(Exit(job, attempt, "n0", t + 0.4, code, run_id=run)))]


def test_reused_name_absurd_attempt_and_stray_record(kafka_bootstrap: str, topic_prefix: str,
                                                     tmp_path: Path) -> None:
    log = tmp_path / "processor.log"
    reused, absurd, phantom, control = (_job("reused"), _job("absurd"), _job("phantom"),
                                        _job("control"))
    logs = f"{topic_prefix}logs"
    with processor(kafka_bootstrap, topic_prefix, log, "--settle-s", "1",
                   "--node-lost-s", "3") as proc:
        wait_event(log, "partitions_assigned", 90, lambda e: e.get("partitions") != "-",
                   proc=proc)
        t = time.time()
        # case 2: run g-1 fails retryably (restart), its attempt 1 finishes; then a new run of
        # the same name (g-2, attempt 0) fails fatally: that failure must be decided
        asyncio.run(produce_records(kafka_bootstrap, logs,
                                    _attempt(reused, "g-1", 0, t, RETRYABLE, 1)))
        first = wait_decisions(kafka_bootstrap, topic_prefix, reused, 1, timeout_s=60)
        assert [(d["action"], d["run_id"]) for d in first] == [("restart", "g-1")], first
        asyncio.run(produce_records(kafka_bootstrap, logs,
                            _attempt(reused, "g-1", 1, t + 2, None, 0)
                            + _attempt(reused, "g-2", 0, t + 5, FATAL, 1)))
        # case 7: a heartbeat claiming attempt 999999 arrives before the real failure
        key = wire.log_key(absurd, "n0")
        junk = (key, wire.encode_heartbeat(Heartbeat(absurd, 999999, "n0", t + 0.25, True,
                                                     t, t, run_id="g-a")))
        recs = _attempt(absurd, "g-a", 0, t, FATAL, 1)
        asyncio.run(produce_records(kafka_bootstrap, logs, recs[:2] + [junk] + recs[2:]))
        # case 14: a stray lines record of a job nobody started; a started job whose node
        # then goes quiet is the positive control (it is lost; the phantom must not be)
        asyncio.run(produce_records(kafka_bootstrap, logs, [
            (wire.log_key(phantom, "n0"), wire.encode_lines(phantom, 0, "n0", "g-p", [
                Line("stdout", 0, t, "hello")])),
            (wire.log_key(control, "n0"), wire.encode_run_start(RunStart(
                control, 0, "n0", t, run_id="g-c", run_source="generated"))),
            (wire.log_key(control, "n0"), wire.encode_heartbeat(Heartbeat(
                control, 0, "n0", t, True, t, t, run_id="g-c")))]))
        reused_decs = wait_decisions(kafka_bootstrap, topic_prefix, reused, 2, timeout_s=60)
        absurd_decs = wait_decisions(kafka_bootstrap, topic_prefix, absurd, 1, timeout_s=60)
        control_decs = wait_decisions(kafka_bootstrap, topic_prefix, control, 1, timeout_s=90)
        wait_processed(kafka_bootstrap, topic_prefix)
        phantom_decs = decisions(kafka_bootstrap, topic_prefix, phantom)
        assert proc.poll() is None, log.read_text()[-3000:]
    assert [(d["action"], d["attempt"], d["run_id"]) for d in reused_decs] == \
        [("restart", 0, "g-1"), ("fail", 0, "g-2")], reused_decs
    assert reused_decs[1]["reason"]["rule"] and "ModuleNotFoundError" in \
        reused_decs[1]["evidence"]["first_error"]["line"]
    assert [(d["action"], d["attempt"]) for d in absurd_decs] == [("fail", 0)], absurd_decs
    assert [d["reason"]["kind"] for d in control_decs] == ["node-lost"], control_decs
    assert phantom_decs == [], phantom_decs


# attempt 0: n0 runs on, n1 hits a retryable error; attempt 1 ends at once on both
LAUNCHED = ("import os, sys, time\n"
            "a = os.environ['FAULTWATCH_ATTEMPT']\n"
            "print('attempt', a, flush=True)\n"
            "if a == '0' and os.environ.get('FAIL') == '1':\n"
            "    time.sleep(1.0)\n"
            "    print('RuntimeError: Socket Timeout', file=sys.stderr, flush=True)\n"
            "    sys.exit(1)\n"
            "time.sleep(20 if a == '0' else 0.2)\n")


def test_two_agents_of_one_launch_share_a_run_id_without_flags(
        kafka_bootstrap: str, topic_prefix: str, tmp_path: Path) -> None:
    """Issue 36 item 2: two agents of one two-node launch, no --run-id, no --rdzv-id; the
    launch names its rendezvous (MASTER_ADDR/MASTER_PORT, as torchrun's ranks and Kubeflow's
    pods have it). Both derive one run id, the restart decision names that run alone, and
    both act on it, none refusing it (before: two generated ids). A launch over two nodes
    that names no rendezvous is warned about on the agent's stderr."""
    import subprocess
    import sys

    from tests.support.cluster import agent_cmd
    from tests.support.kafka import consume
    from tests.support.processes import job_env

    job, log = _job("launch"), tmp_path / "processor.log"
    master = {"MASTER_ADDR": f"trainer-{uuid.uuid4().hex[:6]}", "MASTER_PORT": "29500"}
    with processor(kafka_bootstrap, topic_prefix, log, "--settle-s", "0.5") as proc:
        wait_event(log, "partitions_assigned", 90, lambda e: e.get("partitions") != "-",
                   proc=proc)
        agents = [subprocess.Popen(
            agent_cmd(kafka_bootstrap, topic_prefix, job, node, [sys.executable, "-c", LAUNCHED],
                      "--follow-decisions", "--nnodes", "2", "--spool-dir",
                      str(tmp_path / node)),
            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
            env=job_env(**master, FAIL="1" if node == "n1" else "0"))
            for node in ("n0", "n1")]
        errs = [a.communicate(timeout=120)[1].decode() for a in agents]
        decs = wait_decisions(kafka_bootstrap, topic_prefix, job, 1, timeout_s=30)
        lone = subprocess.run(agent_cmd(kafka_bootstrap, topic_prefix, _job("lone"), "n9",
                                        ["true"], "--nnodes", "2", "--spool-dir",
                                        str(tmp_path / "lone")),
                              capture_output=True, text=True, timeout=60, env=job_env())
        assert proc.poll() is None, log.read_text()[-3000:]
    starts = [wire.run_start_of(r) for r in consume(
        kafka_bootstrap, f"{topic_prefix}logs",
        lambda rs: sum(r["t"] == "start" and r["job"] == job for r in rs) >= 4)
        if r["t"] == "start" and r["job"] == job]
    ids = {(s.run_id, s.run_source) for s in starts}
    assert len(ids) == 1 and next(iter(ids))[1] == "rendezvous", ids
    run_id = next(iter(ids))[0]
    assert [(d["action"], d["run_id"], d.get("run_ids") or []) for d in decs] == [
        ("restart", run_id, [])], decs
    for node, err, agent in zip(("n0", "n1"), errs, agents, strict=True):
        assert agent.returncode == 0, f"{node}: {err[-3000:]}"
        assert err.count("event=restart ") == 1 and "decision_refused" not in err, err[-3000:]
        assert "run_id_not_shared" not in err
    assert "event=run_id_not_shared" in lone.stderr, lone.stderr[-2000:]
