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
