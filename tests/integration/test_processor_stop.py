"""SIGTERM stops a processor worker cleanly and in time: with the broker up its partitions
move to the other worker at once and no decision is lost or duplicated; with the broker
gone it gives up the flush, says so once, and still exits within the bound."""

from __future__ import annotations

import asyncio
import os
import signal
import threading
import time
import uuid
from collections import defaultdict
from pathlib import Path

import orjson
import pytest
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer

from faultwatch import wire
from faultwatch.core.events import Exit, Line, RunStart
from faultwatch.kafka import broker as kafka_broker
from tests.support.cluster import processor, wait_event
from tests.support.waiting import wait_until_async

pytestmark = pytest.mark.kafka

PARTITIONS = 4
SESSION_TIMEOUT_S = 30.0  # a worker that did not leave the group keeps its partitions so long
STOP_TIMEOUT_S = 8.0


def all_assigned(e: dict[str, str]) -> bool:
    return len(e.get("partitions", "-").split(",")) == 2 * PARTITIONS


def failing_job(job: str) -> list[bytes]:
    """A job that fails at once, on a node of its own (one node starting hundreds of jobs a
    minute is what the processor's per-node quotas refuse: core/quota.py)."""
    t, node = time.time(), f"n-{job}"
    return [wire.encode_run_start(RunStart(job, 0, node, t)),
            wire.encode_lines(job, 0, node, "r", [
                Line("stderr", 0, t, "Traceback (most recent call last):"),
                Line("stderr", 1, t, "ModuleNotFoundError: No module named 'foo'")]),
            wire.encode_exit(Exit(job, 0, node, t + 0.05, exit_code=1))]


async def produce_jobs(bootstrap: str, topic: str, jobs: list[str], per_s: float,
                       spread: bool = False, stop: threading.Event | None = None,
                       partitions: list[int] | None = None) -> list[str]:
    """Each job's records in order; `spread`: job i on logs partition i; `partitions`: job i
    on partitions[i]. Stops early when `stop` is set; returns the jobs sent."""
    p = AIOKafkaProducer(bootstrap_servers=bootstrap, acks="all")
    await p.start()
    sent: list[str] = []
    try:
        t0 = time.monotonic()
        for i, job in enumerate(jobs):
            if stop is not None and stop.is_set():
                break
            sent.append(job)
            for v in failing_job(job):
                part = partitions[i] if partitions else (i if spread else None)
                await p.send(topic, v, key=wire.log_key(job, f"n-{job}"), partition=part)
            await asyncio.sleep(max(0.0, t0 + (i + 1) / per_s - time.monotonic()))
        await p.flush()
    finally:
        await p.stop()
    return sent


async def decisions_by_job(bootstrap: str, topic: str, jobs: set[str], timeout_s: float,
                           linger_s: float) -> dict[str, set[str]]:
    """Decision ids per job (deduped by id); reads until every job has one, then `linger_s`
    more to catch late duplicates."""
    c = AIOKafkaConsumer(topic, bootstrap_servers=bootstrap, auto_offset_reset="earliest",
                         group_id=None)
    await c.start()
    ids: dict[str, set[str]] = defaultdict(set)

    async def more() -> dict[str, set[str]]:
        batch = await c.getmany(timeout_ms=500)
        for msgs in batch.values():
            for m in msgs:
                d = orjson.loads(m.value)
                ids[d["job"]].add(f"{d['id']}:{d['action']}:{d['reason']['kind']}")
        return ids

    try:
        await wait_until_async(more, timeout_s, f"a decision of each of {len(jobs)} jobs",
                               interval_s=0, until=lambda got: jobs <= set(got),
                               raise_on_timeout=False)
        if jobs <= set(ids):  # then read on for late duplicates
            await wait_until_async(more, linger_s, "late duplicates", interval_s=0,
                                   until=lambda _: False, raise_on_timeout=False)
    finally:
        await c.stop()
    return ids


def warm_up(bootstrap: str, prefix: str, rounds: int = 5) -> int:
    """Send a probe job to each logs partition until each is decided; returns how many
    probes were lost. Faust (0.15.3) sometimes skips the first records a partition gets
    after a rebalance (seen here and on main, not caused by the stop): the test checks the
    stop on partitions that are known to flow, and reports these losses."""
    todo, lost = list(range(PARTITIONS)), 0
    for _ in range(rounds):
        probes = {f"probe-{p}-{uuid.uuid4().hex[:4]}": p for p in todo}
        asyncio.run(produce_jobs(bootstrap, f"{prefix}logs", list(probes), 100, spread=False,
                                 partitions=list(probes.values())))
        got = asyncio.run(decisions_by_job(bootstrap, f"{prefix}decisions", set(probes),
                                           timeout_s=20, linger_s=0))
        todo = [p for j, p in probes.items() if j not in got]
        lost += len(todo)
        if not todo:
            return lost
    raise AssertionError(f"logs partitions {todo} never delivered a probe job")


def test_sigterm_under_load_hands_partitions_over_at_once_nothing_lost(
        kafka_bootstrap: str, topic_prefix: str, tmp_path: Path) -> None:
    env = {"FAULTWATCH_SESSION_TIMEOUT_S": str(SESSION_TIMEOUT_S)}
    flags = ("--partitions", str(PARTITIONS), "--settle-s", "0.5",
             "--stop-timeout-s", str(STOP_TIMEOUT_S))
    log_a, log_b = tmp_path / "a.log", tmp_path / "b.log"
    jobs = [f"load-{i:03d}-{uuid.uuid4().hex[:4]}" for i in range(240)]
    with processor(kafka_bootstrap, topic_prefix, log_a, *flags, env=env) as a:
        wait_event(log_a, "partitions_assigned", 90, all_assigned, proc=a)
        with processor(kafka_bootstrap, topic_prefix, log_b, *flags, env=env) as b:
            # B has joined when it got a share and A has taken the rest (both handlers ran:
            # records that arrive while a worker rebalances can be skipped by Faust)
            wait_event(log_b, "partitions_assigned", 90,
                       lambda e: e.get("partitions", "-") != "-", proc=b)
            wait_event(log_a, "partitions_assigned", 90,
                       lambda e: e.get("partitions", "-") not in ("-", "") and
                       not all_assigned(e), proc=a)
            # both workers consume every logs partition: a probe job per partition decided
            lost = warm_up(kafka_bootstrap, topic_prefix)
            # Load on both workers, stopped at the SIGTERM: records produced while the group
            # rebalances can be skipped by Faust itself (see the report), which is not what
            # this test is about; what A had fetched, was settling or had not yet consumed
            # when it was stopped is.
            stop_load = threading.Event()
            first: list[str] = []
            load = threading.Thread(target=lambda: first.extend(asyncio.run(produce_jobs(
                kafka_bootstrap, f"{topic_prefix}logs", jobs, per_s=30, stop=stop_load))))
            load.start()
            time.sleep(3.0)  # load running on both workers
            assert a.poll() is None, log_a.read_text()[-3000:]
            stop_load.set()
            load.join(60)
            t_term = time.monotonic()
            os.killpg(a.pid, signal.SIGTERM)
            rc = a.wait(STOP_TIMEOUT_S + 5)
            stop_s = time.monotonic() - t_term
            wait_event(log_b, "partitions_assigned", SESSION_TIMEOUT_S + 30,
                       all_assigned, proc=b)
            takeover_s = time.monotonic() - t_term
            # the rest of the jobs, on B alone (a positive control that B consumes all)
            lost += warm_up(kafka_bootstrap, topic_prefix)
            rest = [j for j in jobs if j not in set(first)]
            asyncio.run(produce_jobs(kafka_bootstrap, f"{topic_prefix}logs", rest, per_s=60))
            got = asyncio.run(decisions_by_job(kafka_bootstrap, f"{topic_prefix}decisions",
                                               set(jobs), timeout_s=120, linger_s=5))
            assert b.poll() is None, log_b.read_text()[-3000:]
    print(f"stop_s={stop_s:.2f} takeover_s={takeover_s:.2f} warm-up probes lost={lost}")
    assert rc == 0, log_a.read_text()[-3000:]
    assert stop_s < STOP_TIMEOUT_S, stop_s
    stopped = wait_event(log_a, "processor_stopped", 1)
    assert "leave_group" in stopped["steps"], stopped
    # B took over well before the 30 s session timeout would have handed it the partitions
    assert takeover_s < SESSION_TIMEOUT_S / 3, takeover_s
    assert 60 < len(first) < len(jobs), len(first)
    missing = [j for j in jobs if j not in got]
    assert not missing, f"{len(missing)} job(s) without a decision: {missing[:5]}"
    dup = {j: ids for j, ids in got.items() if j in set(jobs) and len(ids) != 1}
    assert not dup, dup
    assert all(next(iter(got[j])).endswith(":fail:error") for j in jobs), got[jobs[0]]




def test_sigterm_with_the_broker_gone_exits_in_time_and_says_what_it_gave_up(
        own_broker: tuple[str, Path, int], topic_prefix: str, tmp_path: Path) -> None:
    bootstrap, data, port = own_broker
    flags = ("--stop-timeout-s", "5", "--settle-s", "0.5")
    log_1, log_2 = tmp_path / "p1.log", tmp_path / "p2.log"
    with processor(bootstrap, topic_prefix, log_1, *flags) as p1, \
            processor(bootstrap, f"x{topic_prefix}", log_2, *flags) as p2:
        for log, p in ((log_1, p1), (log_2, p2)):
            wait_event(log, "partitions_assigned", 90,
                       lambda e: e.get("partitions", "-") != "-", proc=p)
        # positive control: the worker is live on this broker (a job gets decided)
        job, job2 = f"ok-{uuid.uuid4().hex[:6]}", f"ok2-{uuid.uuid4().hex[:6]}"
        asyncio.run(produce_jobs(bootstrap, f"{topic_prefix}logs", [job], per_s=100))
        asyncio.run(produce_jobs(bootstrap, f"x{topic_prefix}logs", [job2], per_s=100))
        wait_event(log_1, "decision", 60, lambda e: e.get("job") == job, proc=p1)
        # the second worker has work of its own too, so its stop has something to give up
        # on (with nothing to flush it may finish before a second signal arrives)
        wait_event(log_2, "decision", 60, lambda e: e.get("job") == job2, proc=p2)
        kafka_broker.down(data, port)
        time.sleep(2.0)  # the workers notice: ticks and heartbeats now fail
        # one SIGTERM: the flush is given up, one event says so, exit 0 within the bound
        t_term = time.monotonic()
        os.killpg(p1.pid, signal.SIGTERM)
        rc1 = p1.wait(15)
        stop_1 = time.monotonic() - t_term
        # SIGTERM then SIGINT: the second signal exits at once
        # (back to back: with nothing to flush the first stop may finish in a moment, and a
        # second signal after the exit would test nothing)
        os.killpg(p2.pid, signal.SIGTERM)
        t_int = time.monotonic()
        os.killpg(p2.pid, signal.SIGINT)
        rc2 = p2.wait(15)
        forced_s = time.monotonic() - t_int
    print(f"broker down: stop_s={stop_1:.2f} second signal exit_s={forced_s:.2f}")
    assert rc1 == 0, log_1.read_text()[-3000:]
    assert stop_1 < 5.0 + 0.5, stop_1
    gave_up = wait_event(log_1, "processor_stop_gave_up", 1)
    assert gave_up["step"] in ("finish_batches", "deliver", "commit", "leave_group"), gave_up
    assert "processor_stopped" not in log_1.read_text()
    assert len([ln for ln in log_1.read_text().splitlines()
                if "event=processor_stop_gave_up" in ln]) == 1
    # (the exit code names the signal handled second: when both are pending at once Linux
    # delivers the lower-numbered SIGINT first, then the SIGTERM is the second one)
    assert rc2 in (128 + signal.SIGINT, 128 + signal.SIGTERM), log_2.read_text()[-3000:]
    assert forced_s < 1.5, forced_s
    wait_event(log_2, "processor_stop_forced", 1)
