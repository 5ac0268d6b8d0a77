"""Malformed decisions and log records on real topics: the agent, `faultwatch decisions` and
`faultwatch logs` skip and report each bad row (topic, partition, offset) and go on."""

from __future__ import annotations

import re
import subprocess
import sys
import time
from pathlib import Path

import orjson
import pytest

from faultwatch import wire
from faultwatch.agents.config import EXIT_FAILED_BY_DECISION
from faultwatch.core.events import Line
from tests.support.agents import FOREVER, decision, start_agent
from tests.support.kafka import produce

pytestmark = pytest.mark.kafka


def bad_decisions(job: str) -> list[bytes]:
    good = wire.decision_to_dict(decision(job, "restart", ("n1",)))
    return [
        orjson.dumps({**good, "id": "nested", "targets": {"nodes": [["n1"]], "ranks": []}}),
        orjson.dumps({**good, "id": ["x"]}),
        orjson.dumps({"v": 1, "id": "missing-fields", "job": job}),
        orjson.dumps({**good, "id": "ranks", "targets": {"nodes": ["n1"], "ranks": "x"}}),
        b"{not json",
        b"[1, 2]",
    ]


def test_agent_survives_malformed_decisions_and_acts_on_the_next_good_one(
        kafka_bootstrap: str, topic_prefix: str, tmp_path: Path) -> None:
    job = "bad-dec"
    p = start_agent(kafka_bootstrap, topic_prefix, tmp_path, job, FOREVER)
    assert p.stdout is not None and p.stdout.readline() == b"running\n"
    topic = f"{topic_prefix}decisions"
    bad = bad_decisions(job)
    produce(kafka_bootstrap, topic, wire.job_key(job), bad)
    produce(kafka_bootstrap, topic, wire.job_key(job),
            [wire.encode_decision(decision(job, "fail", ("n1",), did="good"))])
    _, err = p.communicate(timeout=60)
    text = err.decode()
    assert p.returncode == EXIT_FAILED_BY_DECISION, text[-3000:]
    # the agent writes into the training job's stderr: the first bad record of each kind in
    # full (topic, partition, offset), the rest counted in a summary line at exit
    reports = [ln for ln in text.splitlines() if "event=undecodable_decision " in ln]
    counted = sum(int(m.group(1)) for m in re.finditer(
        r"event=undecodable_decision_summary .*?count=(\d+)", text))
    assert reports and len(reports) + counted == len(bad), text[-3000:]
    assert all(f"topic={topic}" in r and "partition=0" in r and "offset=" in r
               for r in reports), reports
    assert "Traceback" not in text


def test_decisions_and_logs_readers_skip_bad_rows_and_go_on(
        kafka_bootstrap: str, topic_prefix: str) -> None:
    job = "bad-read"
    dtopic, ltopic = f"{topic_prefix}decisions", f"{topic_prefix}logs"
    produce(kafka_bootstrap, dtopic, wire.job_key(job),
            [wire.encode_decision(decision(job, "notify", (), did="first")),
             *bad_decisions(job),
             wire.encode_decision(decision(job, "fail", ("n1",), did="last"))])
    now = time.time()
    good = wire.encode_lines(job, 0, "n1", "r1", [Line("stdout", 0, now, "hello")])
    bad_rows = [
        orjson.dumps({**orjson.loads(good), "lines": [["x", "y"]]}),  # a bad row
        orjson.dumps({**orjson.loads(good), "lines": "nope"}),
        b"\xff not json",
    ]
    last = wire.encode_lines(job, 0, "n1", "r1", [Line("stdout", 1, now, "world")])
    produce(kafka_bootstrap, ltopic, wire.log_key(job, "n1"), [good, *bad_rows, last])

    for args in (["decisions", "--topic-prefix", topic_prefix],
                 ["decisions", "--json", "--topic-prefix", topic_prefix]):
        res = subprocess.run([sys.executable, "-m", "faultwatch", *args,
                              "--bootstrap", kafka_bootstrap],
                             capture_output=True, timeout=60)
        out, err = res.stdout.decode(), res.stderr.decode()
        assert res.returncode == 0, err[-3000:]
        assert "first" in out and "last" in out, (out, err)
        assert err.count("event=undecodable_record") == len(bad_decisions(job)), err
        assert f"topic={dtopic}" in err and "offset=" in err and "Traceback" not in err
    res = subprocess.run([sys.executable, "-m", "faultwatch", "logs", job, "--topic-prefix",
                          topic_prefix, "--bootstrap", kafka_bootstrap],
                         capture_output=True, timeout=60)
    out, err = res.stdout.decode(), res.stderr.decode()
    assert res.returncode == 0, err[-3000:]
    assert [x.split(" ", 1)[1] for x in out.splitlines() if "──" not in x] == [
        "[n1] hello", "[n1] world"], (out, err)  # (time first; attempt and exit separators)
    assert err.count("event=undecodable_record") == len(bad_rows), err
    assert f"topic={ltopic}" in err and "Traceback" not in err


def test_a_decision_about_another_run_of_the_job_is_ignored(
        kafka_bootstrap: str, topic_prefix: str, tmp_path: Path) -> None:
    """A reused job name: the decisions of an earlier run (another run id) do not touch
    this run; its own decision does (positive control)."""
    import dataclasses

    job = "reused"
    p = start_agent(kafka_bootstrap, topic_prefix, tmp_path, job, FOREVER, "--run-id", "R1")
    assert p.stdout is not None and p.stdout.readline() == b"running\n"
    old = dataclasses.replace(decision(job, "blacklist", ("n1",), did="old"), run_id="R0")
    mine = dataclasses.replace(decision(job, "fail", ("n1",), did="mine"), run_id="R1")
    produce(kafka_bootstrap, f"{topic_prefix}decisions", wire.job_key(job),
            [wire.encode_decision(old), wire.encode_decision(mine)])
    _, err = p.communicate(timeout=60)
    assert p.returncode == EXIT_FAILED_BY_DECISION, err.decode()[-3000:]
    refused = [ln for ln in err.splitlines() if b"event=decision_refused" in ln]
    assert any(b"reason=other_run" in ln and b"id=old" in ln for ln in refused), err
