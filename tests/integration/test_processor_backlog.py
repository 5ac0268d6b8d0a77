"""A chatty job's backlog (2,000 records of 10 long, rule-matching lines, waiting while no
processor ran) reaches the signals topic whole, in records under the broker's 1 MB limit,
and a failing job inside that backlog still gets its error decision (not a late node-lost)."""

from __future__ import annotations

import asyncio
import time
import uuid
from pathlib import Path

import orjson
import pytest
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer

from faultwatch import wire
from faultwatch.core.events import Exit, Line, RunStart
from faultwatch.kafka.admin import ensure_topics
from faultwatch.wire.topics import Topics
from tests.support.cluster import processor, wait_decisions
from tests.support.waiting import wait_until_async

pytestmark = pytest.mark.kafka

RECORDS, LINES = 2000, 10
BROKER_LIMIT = 1_048_576


async def produce_backlog(bootstrap: str, topic: str, chatty: str, failing: str) -> None:
    p = AIOKafkaProducer(bootstrap_servers=bootstrap, acks="all", linger_ms=20,
                         max_batch_size=1 << 20)
    await p.start()
    try:
        t = time.time() - 60  # an hour's backlog in spirit: event times in the past
        await p.send(topic, wire.encode_run_start(RunStart(chatty, 0, "n0", t)),
                     key=wire.log_key(chatty, "n0"), partition=0)
        for i in range(RECORDS):
            ts = t + i * 0.01
            # lines a rule matches: each brings a hit with its line, so the signals of a
            # fetch (1 MB of records per partition) outweigh the records themselves
            rows = [Line("stderr", i * LINES + k, ts,
                         f"RuntimeError: NCCL error in: nccl.cpp:{i}, unhandled system error "
                         f"item {k} " + "detail " * 130) for k in range(LINES)]
            await p.send(topic, wire.encode_lines(chatty, 0, "n0", "r", rows),
                         key=wire.log_key(chatty, "n0"), partition=0)
            if i == RECORDS // 2:  # a job that fails in the middle of the backlog
                for v in (wire.encode_run_start(RunStart(failing, 0, "n0", ts)),
                          wire.encode_lines(failing, 0, "n0", "r", [
                              Line("stderr", 0, ts, "Traceback (most recent call last):"),
                              Line("stderr", 1, ts, "ModuleNotFoundError: No module named "
                                                    "'foo'")]),
                          wire.encode_exit(Exit(failing, 0, "n0", ts + 0.01, exit_code=1))):
                    await p.send(topic, v, key=wire.log_key(failing, "n0"), partition=0)
        await p.flush()
    finally:
        await p.stop()


async def count_lines(bootstrap: str, topic: str, job: str, want: int,
                      timeout_s: float) -> tuple[int, int, int]:
    """(lines counted in the job's Output signals, records read, largest record)."""
    c = AIOKafkaConsumer(topic, bootstrap_servers=bootstrap, auto_offset_reset="earliest",
                         group_id=None, max_partition_fetch_bytes=4 << 20)
    await c.start()
    lines = records = biggest = 0

    async def more() -> int:
        nonlocal lines, records, biggest
        batch = await c.getmany(timeout_ms=500)
        for msgs in batch.values():
            for m in msgs:
                records += 1
                biggest = max(biggest, len(m.value))
                d = orjson.loads(m.value)
                if d.get("t") == "bundle" and d.get("job") == job:
                    lines += sum(s["count"] for s in d["sigs"] if s["t"] == "out")
        return lines

    try:
        if want > 0:
            await wait_until_async(more, timeout_s, f"{want} lines of {job} on {topic}",
                                   interval_s=0, until=lambda n: n >= want,
                                   raise_on_timeout=False)
    finally:
        await c.stop()
    return lines, records, biggest


def test_a_backlog_of_long_lines_reaches_signals_whole_and_in_bounds(
        kafka_bootstrap: str, topic_prefix: str, tmp_path: Path) -> None:
    chatty, failing = f"chatty-{uuid.uuid4().hex[:6]}", f"failing-{uuid.uuid4().hex[:6]}"
    asyncio.run(ensure_topics(kafka_bootstrap, Topics(topic_prefix), 2))
    asyncio.run(produce_backlog(kafka_bootstrap, f"{topic_prefix}logs", chatty, failing))
    log = tmp_path / "processor.log"
    with processor(kafka_bootstrap, topic_prefix, log, "--settle-s", "0.5") as proc:
        lines, records, biggest = asyncio.run(count_lines(
            kafka_bootstrap, f"{topic_prefix}signals", chatty, RECORDS * LINES, 180))
        decs = wait_decisions(kafka_bootstrap, topic_prefix, failing, timeout_s=90)
        assert proc.poll() is None, log.read_text()[-3000:]
    text = log.read_text(errors="replace")
    print(f"lines={lines} signals_records={records} biggest_record={biggest}")
    assert lines == RECORDS * LINES, text[-3000:]
    assert biggest < BROKER_LIMIT
    assert "MessageSizeTooLarge" not in text and "event=dead_letter" not in text
    assert "event=produce_failed" not in text
    assert [(d["action"], d["reason"]["kind"]) for d in decs] == [("fail", "error")], decs
