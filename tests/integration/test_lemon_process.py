"""Lemon nodes through `faultwatch process` on the real broker: the worker follows the
incidents topic, and ledger records (the incident publisher's encoding) that blame one node in
three distinct jobs make it publish a `lemon-node` decision of job `(fleet)`, which
`lemon_action: quarantine` makes a blacklist that quarantines the node in the registry; a node
blamed in two of those same records (fewer than `lemon_min_jobs`) gets neither."""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from faultwatch.core.blast import NOTICE_JOB
from faultwatch.core.goodput import account
from faultwatch.core.ledger import Attempt, Incident, Ledger
from faultwatch.core.lemons import LEMON_KIND
from faultwatch.core.registry import QUARANTINED
from faultwatch.wire.incidents import encode_ledger, incident_key
from faultwatch.wire.topics import Topics
from tests.support.cluster import (
    events,
    node_records,
    processor,
    wait_decisions,
    wait_event,
    wait_processor_ready,
)
from tests.support.kafka import produce_records
from tests.support.waiting import wait_until

pytestmark = pytest.mark.kafka

RULES = """\
version: 1
policy:
  settle_s: 0.5
  lemon_action: quarantine
rules: []
"""
LEMON, OTHER = "lemon-n7", "flaky-n8"


def ledger_record(job: str, blamed: list[str], now: float) -> tuple[bytes, bytes]:
    """A run's record as IncidentPublisher writes it: one hardware error per blamed node."""
    run_id = f"run-{job}"
    incidents = tuple(
        Incident(id=f"d{i}-{job}", attempt=1, cause="error", kind="nccl-error",
                 action="restart", rule="nccl-error", category="hardware", nodes=(node,),
                 ranks=(0,), first_sign_ts=now - 60.0 + i, detected_ts=now - 59.0 + i)
        for i, node in enumerate(blamed))
    led = Ledger(job=job, run_id=run_id, attempts=(Attempt(1, now - 600.0, 2),),
                 incidents=incidents, nodes=tuple(blamed), first_ts=now - 600.0,
                 last_ts=now - 59.0, rev=1)
    return incident_key(job, run_id), encode_ledger(led, account(led, now), now)


@pytest.fixture(scope="module")
def worker(kafka_bootstrap: str, tmp_path_factory: pytest.TempPathFactory
           ) -> Iterator[tuple[str, Path]]:
    """One processor with the quarantine lemon policy, its incidents follower caught up."""
    prefix = f"lemon{uuid.uuid4().hex[:8]}."
    d = tmp_path_factory.mktemp("lemon")
    rules, log = d / "rules.yaml", d / "processor.log"
    rules.write_text(RULES)
    with processor(kafka_bootstrap, prefix, log, "--rules", str(rules)) as proc:
        wait_processor_ready(kafka_bootstrap, prefix, proc, log)
        wait_event(log, "incidents_loaded", 60, proc=proc)
        yield prefix, log
        assert proc.poll() is None, log.read_text()[-3000:]


def test_a_node_blamed_in_three_jobs_is_a_lemon_one_blamed_in_two_is_not(
        kafka_bootstrap: str, worker: tuple[str, Path]) -> None:
    prefix, log = worker
    now = time.time()
    jobs = [f"train-{uuid.uuid4().hex[:6]}" for _ in range(3)]
    records = [ledger_record(jobs[0], [OTHER, LEMON], now),
               ledger_record(jobs[1], [OTHER, LEMON], now),
               ledger_record(jobs[2], [LEMON], now)]
    asyncio.run(produce_records(kafka_bootstrap, Topics(prefix).incidents, records))

    got = wait_decisions(kafka_bootstrap, prefix, NOTICE_JOB, 1, timeout_s=60)
    assert [d["reason"]["kind"] for d in got] == [LEMON_KIND], got
    (dec,) = got
    assert dec["targets"]["nodes"] == [LEMON] and dec["action"] == "blacklist"
    assert sorted(dec["evidence"]["jobs"]) == sorted(jobs)
    # OTHER's two blames came in the first two of those records, each taken before the
    # decision was published (one follower, in order): no notice names it
    assert [e["node"] for e in events(log, "lemon_node")] == [LEMON]
    assert not any(OTHER in d["targets"]["nodes"] for d in got)

    recs = wait_until(lambda: node_records(kafka_bootstrap, prefix).get(LEMON), 60,
                      f"{LEMON}'s registry record", interval_s=1.0,
                      until=lambda r: r is not None and r["state"] == QUARANTINED,
                      raise_on_timeout=False)
    assert recs is not None and recs["state"] == QUARANTINED, recs
    assert OTHER not in node_records(kafka_bootstrap, prefix)
    assert not events(log, "processor_task_ended")
