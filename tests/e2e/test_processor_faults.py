"""Faults in faultwatch itself: processors SIGKILLed mid-stream, two processors sharing the
partitions, a broker restart. No missed decision, no duplicate after dedupe by id, no false
hang or node-lost while recovering."""

from __future__ import annotations

import os
import signal
import subprocess
import time
import uuid
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Any

import orjson
import pytest

from tests.support.cluster import decisions, wait_processor_ready
from tests.support.processes import faultwatch_exe, job_env
from tests.support.scenarios import agents, kinds, new_job, policy_file, scenario, wait_for
from tests.support.waiting import wait_until

pytestmark = [pytest.mark.slow, pytest.mark.kafka]

ERR = "RuntimeError: Socket Timeout"
# silent single-process jobs give no evidence that ranks wait for each other: the learned
# window decides on silence alone here (evidence: tests/e2e/test_hang_matrix.py)
POLICY = dict(hang_floor_s=4.0, hang_ceiling_s=60, node_lost_s=6.0, settle_s=1.0,
              max_restarts=5, enable_restart=True, hang_detection=True, restart_backoff_s=0.1,
              hang_needs_evidence=False)


def start_processor(bootstrap: str, prefix: str, log: Path, rules: Path,
                    *flags: str) -> subprocess.Popen[bytes]:
    with open(log, "ab") as out:
        return subprocess.Popen(
            [faultwatch_exe(), "process", "--bootstrap", bootstrap, "--topic-prefix", prefix,
             "--partitions", "2", "--rules", str(rules), *flags],
            stdout=out, stderr=subprocess.STDOUT, start_new_session=True,
            env=job_env(FAULTWATCH_SESSION_TIMEOUT_S="6"))


def kill(p: subprocess.Popen[bytes], sig: int = signal.SIGKILL) -> None:
    if p.poll() is None:
        os.killpg(p.pid, sig)
        try:
            p.wait(20)
        except subprocess.TimeoutExpired:
            os.killpg(p.pid, signal.SIGKILL)
            p.wait(10)


@contextmanager
def processors() -> Iterator[list[subprocess.Popen[bytes]]]:
    procs: list[subprocess.Popen[bytes]] = []
    try:
        yield procs
    finally:
        for p in procs:
            kill(p, signal.SIGTERM)


def raw_decisions(bootstrap: str, prefix: str) -> list[dict[str, Any]]:
    """Every record on the decisions topic (not deduped), read with aiokafka."""
    import asyncio

    from aiokafka import AIOKafkaConsumer

    async def read() -> list[dict[str, Any]]:
        c = AIOKafkaConsumer(f"{prefix}decisions", bootstrap_servers=bootstrap,
                             auto_offset_reset="earliest", enable_auto_commit=False)
        await c.start()
        out: list[dict[str, Any]] = []
        try:
            while True:
                batch = await c.getmany(timeout_ms=1500)
                if not batch:
                    return out
                for msgs in batch.values():
                    out.extend(orjson.loads(m.value) for m in msgs)
        finally:
            await c.stop()

    return asyncio.run(read())


def test_processor_sigkilled_ten_times_mid_stream(kafka_bootstrap: str, tmp_path: Path) -> None:
    bootstrap, prefix = kafka_bootstrap, f"kill{uuid.uuid4().hex[:8]}."
    rules = policy_file(tmp_path / "policy.yaml", **POLICY)
    log = tmp_path / "processor.log"
    healthy = new_job("healthy")
    failing = [new_job(f"fail{i}") for i in range(10)]
    with agents(bootstrap, prefix, tmp_path) as a, processors() as procs:
        a.start(healthy, "node-0", scenario("forever", 0.2))
        a.start(healthy, "node-1", scenario("forever", 0.2))
        for i, job in enumerate(failing):
            procs.append(start_processor(bootstrap, prefix, log, rules))
            time.sleep(1.5 + (i % 3))
            a.start(job, "node-0", scenario("fail", ERR))
            time.sleep(1.0 + (i % 2))
            kill(procs[-1])  # SIGKILL: no commit, no flush, no goodbye
        procs.append(start_processor(bootstrap, prefix, log, rules))
        wait_until(lambda: all(decisions(bootstrap, prefix, j) for j in failing[-1:]), 90,
                   "the last failing job's decision", interval_s=1.0, raise_on_timeout=False)
        time.sleep(8.0)  # past the node-lost window and grace: still no false decision
        got = {j: decisions(bootstrap, prefix, j) for j in failing}
        assert decisions(bootstrap, prefix, healthy) == [], "false decision on a healthy job"
        assert procs[-1].poll() is None, log.read_text()[-3000:]
    for j, decs in got.items():
        assert kinds(decs) == [("restart", "error")], (j, decs)  # none missed, one per job
    raw = raw_decisions(bootstrap, prefix)
    dupes = len(raw) - len({d["id"] for d in raw})
    print(f"\n10 SIGKILLs: {len(raw)} decision records, {dupes} duplicate(s) removed by id")


def test_two_processors_share_the_partitions(kafka_bootstrap: str, tmp_path: Path) -> None:
    bootstrap, prefix = kafka_bootstrap, f"two{uuid.uuid4().hex[:8]}."
    # the three silent jobs go quiet together: when the rebalance gives them all to one
    # worker, that is 3 of its 3 active jobs hung at once, a fleet storm by design (held, one
    # notice: tests/integration/test_fleet_storm.py); here each job must be decided
    rules = policy_file(tmp_path / "policy.yaml", **POLICY, fleet_storm_detection=False)
    jobs = [new_job(f"j{i}") for i in range(6)]
    with agents(bootstrap, prefix, tmp_path) as a, processors() as procs:
        for i in range(2):
            procs.append(start_processor(bootstrap, prefix, tmp_path / f"p{i}.log", rules))
        time.sleep(6.0)
        for i, job in enumerate(jobs):
            a.start(job, "node-0", scenario("fail", ERR) if i % 2 else scenario("silent", 25, 0.2))
        got = {j: wait_for(bootstrap, prefix, j, bool, timeout_s=60) for j in jobs}
        time.sleep(3.0)
        got = {j: decisions(bootstrap, prefix, j) for j in jobs}
        assert all(p.poll() is None for p in procs)
    for i, job in enumerate(jobs):
        assert kinds(got[job]) == [("restart", "error" if i % 2 else "hang")], got[job]


def test_broker_restart(tmp_path: Path) -> None:
    from faultwatch.kafka import broker as kafka_broker

    port = kafka_broker.free_port()
    data = tmp_path / "broker"
    bootstrap = kafka_broker.up(port=port, data_dir=data)
    prefix = "brk."
    rules = policy_file(tmp_path / "policy.yaml", **POLICY)
    job, healthy = new_job("brk"), new_job("brkok")
    try:
        with ExitStack() as stack:
            a = stack.enter_context(agents(bootstrap, prefix, tmp_path))
            procs = stack.enter_context(processors())
            procs.append(start_processor(bootstrap, prefix, tmp_path / "p.log", rules))
            a.start(healthy, "node-0", scenario("forever", 0.2))
            # the broker goes away under a running worker (not one still starting up)
            wait_processor_ready(bootstrap, prefix, procs[0], tmp_path / "p.log")
            kafka_broker.down(data, port)
            # the job fails while the broker is down: the agent spools, waits, then delivers
            a.start(job, "node-0", scenario("fail", ERR), flags=("--exit-flush-timeout-s", "120"))
            time.sleep(8.0)
            kafka_broker.up(port=port, data_dir=data)
            decs = wait_for(bootstrap, prefix, job, bool, timeout_s=90)
            time.sleep(8.0)
            assert kinds(decisions(bootstrap, prefix, job)) == [("restart", "error")], decs
            assert decisions(bootstrap, prefix, healthy) == []
            assert procs[0].poll() is None, (tmp_path / "p.log").read_text()[-3000:]
    finally:
        kafka_broker.down(data, port)
