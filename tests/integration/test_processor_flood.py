"""A node that floods a real worker (FAULTWATCH_NODE_LINES_PER_S): its lines past the budget
are counted and announced (a gap notice decision at the episode's start, the node_throttled
line), and a job beside it that fails is decided as ever (the positive control)."""

from __future__ import annotations

import asyncio
import time
import uuid
from pathlib import Path

import pytest

from faultwatch import wire
from faultwatch.core.events import Exit, Line, RunStart
from tests.support.cluster import processor, wait_decisions, wait_event
from tests.support.kafka import produce_records

pytestmark = pytest.mark.kafka

FATAL = "ModuleNotFoundError: No module named 'tensorboardx'"  # built-in fatal


def test_a_flooding_node_is_throttled_and_announced_and_its_neighbour_decided(
        kafka_bootstrap: str, topic_prefix: str, tmp_path: Path) -> None:
    log = tmp_path / "processor.log"
    flood, calm = f"flood-{uuid.uuid4().hex[:6]}", f"calm-{uuid.uuid4().hex[:6]}"
    logs = f"{topic_prefix}logs"
    with processor(kafka_bootstrap, topic_prefix, log, "--settle-s", "1",
                   env={"FAULTWATCH_NODE_LINES_PER_S": "1000"}) as proc:
        wait_event(log, "partitions_assigned", 90, lambda e: e.get("partitions") != "-",
                   proc=proc)
        t = time.time()
        fk, ck = wire.log_key(flood, "n0"), wire.log_key(calm, "n0")
        recs = [(fk, wire.encode_run_start(RunStart(flood, 0, "n0", t, run_id="f"))),
                (ck, wire.encode_run_start(RunStart(calm, 0, "n0", t, run_id="c")))]
        # 40,000 lines in 0.4 s of the flooding node's clock: 100 k lines/s, 100x the budget
        for k in range(400):
            recs.append((fk, wire.encode_lines(flood, 0, "n0", "f", [
                Line("stdout", k * 100 + j, t + (k * 100 + j) * 1e-5, f"[rank0]: x {j}")
                for j in range(100)])))
        recs += [(ck, wire.encode_lines(calm, 0, "n0", "c", [Line("stderr", 0, t + 0.5, FATAL)])),
                 (ck, wire.encode_exit(Exit(calm, 0, "n0", t + 0.6, 1, run_id="c")))]
        asyncio.run(produce_records(kafka_bootstrap, logs, recs))
        calm_decs = wait_decisions(kafka_bootstrap, topic_prefix, calm, 1, timeout_s=90)
        assert [(d["reason"]["kind"], d["action"]) for d in calm_decs] == [("error", "fail")]
        flood_decs = wait_decisions(kafka_bootstrap, topic_prefix, flood, 1, timeout_s=90)
        assert [(d["reason"]["kind"], d["action"]) for d in flood_decs] == [("gap", "notify")]
        assert "budget of 1000 lines/s" in flood_decs[0]["reason"]["message"]
        throttled = wait_event(log, "node_throttled", 30, proc=proc)
        assert throttled["job"] == flood and throttled["node"] == "n0"
