"""One malformed logs record (`"rank": "x"`) is dead-lettered once, with its topic, partition
and offset, and poisons nothing: its own job and another job on the same partition both
still get their node-lost decisions from the partition's ticks."""

from __future__ import annotations

import asyncio
import time
import uuid
from pathlib import Path

import orjson
import pytest

from faultwatch import wire
from faultwatch.core.events import Heartbeat, Line, RunStart
from tests.support.cluster import processor, wait_decisions, wait_event
from tests.support.kafka import produce_records, read_all

pytestmark = pytest.mark.kafka


def test_a_bad_rank_is_dead_lettered_once_and_the_partition_goes_on(
        kafka_bootstrap: str, topic_prefix: str, tmp_path: Path) -> None:
    log = tmp_path / "processor.log"
    bad_job, good_job = f"bad-{uuid.uuid4().hex[:6]}", f"good-{uuid.uuid4().hex[:6]}"
    with processor(kafka_bootstrap, topic_prefix, log, "--partitions", "1",
                   "--node-lost-s", "3") as proc:
        wait_event(log, "partitions_assigned", 90, lambda e: e.get("partitions") != "-",
                   proc=proc)
        t = time.time()
        records = []
        for job in (bad_job, good_job):
            records += [(wire.log_key(job, "n0"), wire.encode_run_start(RunStart(job, 0, "n0", t))),
                        (wire.log_key(job, "n0"), wire.encode_heartbeat(
                            Heartbeat(job, 0, "n0", t, True, t, t)))]
        bad = orjson.loads(wire.encode_lines(bad_job, 0, "n0", "r", [
            Line("stdout", 0, t, "hello")]))
        bad["rank"] = "x"
        records.insert(2, (wire.log_key(bad_job, "n0"), orjson.dumps(bad)))
        asyncio.run(produce_records(kafka_bootstrap, f"{topic_prefix}logs", records))
        # both nodes then go quiet: each job's node is lost once the grace has passed
        good = wait_decisions(kafka_bootstrap, topic_prefix, good_job, timeout_s=90)
        bad_decs = wait_decisions(kafka_bootstrap, topic_prefix, bad_job, timeout_s=30)
        assert proc.poll() is None, log.read_text()[-3000:]
    assert [d["reason"]["kind"] for d in good] == ["node-lost"], good
    assert [d["reason"]["kind"] for d in bad_decs] == ["node-lost"], bad_decs
    dead = asyncio.run(read_all(kafka_bootstrap, f"{topic_prefix}deadletter", 2, 10))
    assert len(dead) == 1, dead
    assert (dead[0]["topic"], dead[0]["partition"], dead[0]["offset"]) == \
        (f"{topic_prefix}logs", 0, 2), dead
    assert "rank" in dead[0]["error"]
    text = log.read_text(errors="replace")
    assert text.count("event=dead_letter") == 1 and "event=job_tick_failed" not in text
