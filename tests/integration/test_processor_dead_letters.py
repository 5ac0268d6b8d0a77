"""Bad records never stop a processor: each goes to the dead-letter topic with its topic,
partition and offset, the log names the first of each kind, and the next good job is still
decided."""

from __future__ import annotations

import asyncio
import time
import uuid
from pathlib import Path

import orjson
import pytest

from faultwatch import wire
from faultwatch.core.events import Exit, Line, RunStart
from tests.support.cluster import processor, wait_decisions, wait_event
from tests.support.kafka import produce_records, read_all

pytestmark = pytest.mark.kafka
REPEAT = 40  # each bad record is sent this many times

BAD: list[bytes] = [
    b"not json at all",
    orjson.dumps({"v": 99, "t": "lines"}),  # a schema version we do not know
    orjson.dumps({"v": 1, "t": "start", "job": "bad", "attempt": 0, "node": "n", "ts": 1.0,
                  "world_size": "big"}),
    orjson.dumps({"v": 1, "t": "hb", "job": "bad", "attempt": 0, "node": "n", "ts": 1.0,
                  "alive": True, "last_output_ts": "yesterday"}),
    orjson.dumps({"v": 1, "t": "lines", "job": "bad", "attempt": 0, "node": "n",
                  "lines": [["o", "seq?", 1.0, "text", 0, 0]]}),
]


def test_bad_records_are_dead_lettered_and_the_processor_goes_on(kafka_bootstrap: str,
                                                                 tmp_path: Path) -> None:
    prefix = f"dl{uuid.uuid4().hex[:8]}."
    log = tmp_path / "processor.log"
    with processor(kafka_bootstrap, prefix, log, "--settle-s", "0.5") as proc:
        wait_event(log, "partitions_assigned", 180, proc=proc)  # consuming before we produce
        asyncio.run(produce_records(kafka_bootstrap, f"{prefix}logs",
                            [(wire.log_key("bad", "n"), v) for v in BAD * REPEAT]))
        job, t = f"good-{uuid.uuid4().hex[:6]}", time.time()
        key = wire.log_key(job, "n0")
        good = [
            wire.encode_run_start(RunStart(job, 0, "n0", t)),
            wire.encode_lines(job, 0, "n0", "r", [
                Line("stderr", 0, t, "[rank1]: Traceback (most recent call last):"),
                Line("stderr", 1, t, "[rank1]: ModuleNotFoundError: No module named 'foo'")]),
            wire.encode_exit(Exit(job, 0, "n0", t + 0.1, exit_code=1)),
        ]
        asyncio.run(produce_records(kafka_bootstrap, f"{prefix}logs", [(key, v) for v in good]))
        decs = wait_decisions(kafka_bootstrap, prefix, job, timeout_s=60)
        assert [d["action"] for d in decs] == ["fail"], decs
        assert proc.poll() is None, log.read_text()[-3000:]
    dead = asyncio.run(read_all(kafka_bootstrap, f"{prefix}deadletter", len(BAD) * REPEAT, 30))
    assert len(dead) == len(BAD) * REPEAT, len(dead)  # every record kept on the topic
    # ... and the log has one line per reason and source, not one per record (issue 35
    # item 7: 10,000 forged records were 10,000 lines); the rest is counted
    assert log.read_text().count("event=dead_letter ") == 1, log.read_text()[-3000:]
    assert {d["topic"] for d in dead} == {f"{prefix}logs"}
    assert all(isinstance(d["partition"], int) and isinstance(d["offset"], int) for d in dead)
    errors = " | ".join(d["error"] for d in dead)
    for needle in ("not JSON", "schema version", "world_size", "last_output_ts", "seq"):
        assert needle in errors, errors
