"""Decided and done jobs leave a real worker's table after FAULTWATCH_FINISHED_TTL_S (issue
29 item 3): a job that ended gets a tombstone on the table's changelog topic, so a restarted
worker (which rebuilds the table from it) and compaction drop it too; a job still running
keeps its state (the positive control of the same run)."""

from __future__ import annotations

import subprocess
import sys
import uuid
from pathlib import Path

import pytest

from tests.support.cluster import agent_cmd, processor, wait_event, wait_processor_ready
from tests.support.kafka import read_topic
from tests.support.processes import job_env
from tests.support.waiting import wait_until

pytestmark = [pytest.mark.kafka, pytest.mark.timeout(300)]

TTL_S = 6.0
LIVE = "import time\nwhile True:\n    print('step', flush=True)\n    time.sleep(0.5)\n"


def _changelog(bootstrap: str, prefix: str) -> list[tuple[bytes, bytes | None]]:
    return [(m.key, m.value) for m in read_topic(bootstrap, f"{prefix}processor-jobs-changelog")]


def test_a_done_job_leaves_the_table_after_its_ttl_and_a_running_one_stays(
        kafka_bootstrap: str, topic_prefix: str, tmp_path: Path) -> None:
    log = tmp_path / "processor.log"
    run = uuid.uuid4().hex[:6]
    done, live = f"ttl-done-{run}", f"ttl-live-{run}"
    with processor(kafka_bootstrap, topic_prefix, log, "--node-lost-s", "300",
                   env={"FAULTWATCH_FINISHED_TTL_S": str(TTL_S),
                        "FAULTWATCH_METRICS_LOG_S": "1"}) as proc:  # every report
        wait_processor_ready(kafka_bootstrap, topic_prefix, proc, log)
        runner = subprocess.Popen(
            agent_cmd(kafka_bootstrap, topic_prefix, live, "n0", [sys.executable, "-c", LIVE],
                      "--spool-dir", str(tmp_path / live)),
            stdout=subprocess.DEVNULL, stderr=open(tmp_path / "live.log", "wb"), env=job_env())
        try:
            ended = subprocess.run(
                agent_cmd(kafka_bootstrap, topic_prefix, done, "n0",
                          [sys.executable, "-c", "print('done')"],
                          "--spool-dir", str(tmp_path / done)),
                capture_output=True, text=True, timeout=120, env=job_env())
            assert ended.returncode == 0, ended.stderr[-3000:]
            # both jobs are in the table first
            wait_until(lambda: {done.encode(), live.encode()}
                       <= {k for k, v in _changelog(kafka_bootstrap, topic_prefix) if v},
                       60, "both jobs' states on the changelog")
            expired = wait_event(log, "jobs_expired", 90, proc=proc)
            assert float(expired["finished_ttl_s"]) == TTL_S
            counted = wait_event(log, "processor_metrics", 60, proc=proc,
                                 where=lambda e: "jobs_expired" in e.get("counters", ""))
            assert counted["jobs_finished"] == "0" and int(counted["jobs_active"]) >= 1
            records = _changelog(kafka_bootstrap, topic_prefix)
            last = dict(records)  # each key's latest record
            assert last[done.encode()] is None, "no tombstone for the done job"
            assert last[live.encode()] is not None  # still running: kept
            assert runner.poll() is None
        finally:
            runner.kill()
            runner.wait(10)
