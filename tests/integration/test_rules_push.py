"""`faultwatch rules push` and hot reload in a running processor, on a real broker."""

from __future__ import annotations

import asyncio
import re
import subprocess
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson
import pytest

from faultwatch import wire
from faultwatch.core.events import STDERR, Exit, Line, RunStart
from faultwatch.errors import EXIT_RULES
from faultwatch.kafka.admin import ensure_topics
from faultwatch.streams.rules_push import publish_record
from faultwatch.streams.rules_record import RULESET_KEY
from faultwatch.streams.rules_watch import assign_topic
from faultwatch.wire.topics import Topics
from tests.e2e.cluster import decisions, processor, wait_decisions
from tests.e2e.conftest import faultwatch_exe, job_env

pytestmark = pytest.mark.kafka

FAILURE = "FluxError: the flux capacitor overheated at step 7"  # no built-in rule knows it

RETRYABLE = f"""\
version: 1
rules:
  - id: site.flux-overheat
    category: retryable
    contains: "flux capacitor overheated"
    description: our flux capacitors cool down after a restart
    tests:
      match: ["{FAILURE}"]
      no_match: ["flux capacitor nominal"]
"""

BROKEN = """\
version: 1
rules:
  - id: site.broken
    category: retriable
    regex: "(unclosed"
    descripton: a typo
"""


def fw(*args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run([faultwatch_exe(), *args], capture_output=True, text=True,
                          timeout=timeout, env=job_env())


def read_topic(bootstrap: str, topic: str, timeout: float = 5.0) -> list[Any]:
    """Every record on the topic now ([] when the topic does not exist)."""
    from aiokafka import AIOKafkaConsumer

    async def main() -> list[Any]:
        c = AIOKafkaConsumer(bootstrap_servers=bootstrap, group_id=None,
                             enable_auto_commit=False, auto_offset_reset="earliest")
        await c.start()
        try:
            tps = await assign_topic(c, topic)
            if not tps:
                return []
            end = await c.end_offsets(tps)
            out: list[Any] = []
            deadline = time.monotonic() + timeout
            while time.monotonic() < deadline:
                if all([await c.position(tp) >= end[tp] for tp in tps]):
                    break
                for msgs in (await c.getmany(timeout_ms=300)).values():
                    out.extend(msgs)
            return out
        finally:
            await c.stop()

    return asyncio.run(main())


def feed_failure(bootstrap: str, prefix: str, job: str, text: str = FAILURE) -> None:
    """What an agent would send for a process that prints `text` and exits with 1."""
    from aiokafka import AIOKafkaProducer

    node, run_id, now = "n0", uuid.uuid4().hex, time.time()
    key = wire.log_key(job, node)
    recs = [
        wire.encode_run_start(RunStart(job=job, attempt=0, node=node, ts=now, run_id=run_id,
                                       nnodes=1, host="h0", pid=42, cmd=("train",))),
        wire.encode_lines(job, 0, node, run_id, [
            Line(STDERR, 0, now + 0.1, "step 1 loss 2.3"),
            Line(STDERR, 1, now + 0.2, text)]),
        wire.encode_exit(Exit(job=job, attempt=0, node=node, ts=now + 0.3, exit_code=1),
                         run_id),
    ]

    async def main() -> None:
        p = AIOKafkaProducer(bootstrap_servers=bootstrap, acks="all")
        await p.start()
        try:
            for r in recs:
                await p.send_and_wait(Topics(prefix).logs, value=r, key=key)
        finally:
            await p.stop()

    asyncio.run(main())


def rules_version_of(stdout: str) -> str:
    m = re.search(r"rules version ([0-9a-f]+)", stdout)
    assert m, stdout
    return m.group(1)


def test_push_invalid_file_exits_with_the_rules_code_and_publishes_nothing(kafka_bootstrap: str,
                                                        topic_prefix: str,
                                                        tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text(BROKEN)
    out = fw("rules", "push", str(bad), "--bootstrap", kafka_bootstrap,
             "--topic-prefix", topic_prefix)
    assert out.returncode == EXIT_RULES, out
    errors = [ln for ln in out.stderr.splitlines() if ln.startswith(f"{bad}:")]
    assert len(errors) >= 3, out.stderr  # all at once: category, regex, unknown key
    assert all(re.match(rf"{re.escape(str(bad))}:\d+: ", ln) for ln in errors)
    assert any("did you mean" in ln for ln in errors), errors
    assert read_topic(kafka_bootstrap, Topics(topic_prefix).rules) == []


def test_push_valid_file_writes_one_record(kafka_bootstrap: str, topic_prefix: str,
                                           tmp_path: Path) -> None:
    good = tmp_path / "site.yaml"
    good.write_text(RETRYABLE)
    out = fw("rules", "push", str(good), "--bootstrap", kafka_bootstrap,
             "--topic-prefix", topic_prefix)
    assert out.returncode == 0, out.stderr
    version = rules_version_of(out.stdout)
    recs = read_topic(kafka_bootstrap, Topics(topic_prefix).rules)
    assert len(recs) == 1 and recs[0].key == RULESET_KEY
    d = orjson.loads(recs[0].value)
    assert d["v"] == 1 and d["version"] == version and d["builtin"] is True
    assert d["files"] == [{"name": "site.yaml", "text": RETRYABLE}]


@pytest.fixture
def running_processor(kafka_bootstrap: str, topic_prefix: str,
                      tmp_path: Path) -> Iterator[Path]:
    log = tmp_path / "processor.log"
    with processor(kafka_bootstrap, topic_prefix, log, "--settle-s", "1") as proc:
        time.sleep(2.0)
        assert proc.poll() is None, log.read_text()
        yield log
        assert proc.poll() is None, f"processor died:\n{log.read_text()[-4000:]}"


def wait_log(log: Path, needle: str, timeout: float = 30.0) -> str:
    deadline = time.time() + timeout
    while time.time() < deadline:
        text = log.read_text(errors="replace")
        if needle in text:
            return text
        time.sleep(0.3)
    raise AssertionError(f"{needle!r} not in processor log:\n{log.read_text()[-4000:]}")


def one_decision(bootstrap: str, prefix: str, job: str) -> dict[str, Any]:
    decs = wait_decisions(bootstrap, prefix, job, timeout_s=60)
    assert len(decs) == 1, decs
    return decs[0]


def test_processor_hot_reloads_pushed_rules(kafka_bootstrap: str, topic_prefix: str,
                                            tmp_path: Path, running_processor: Path) -> None:
    log = running_processor
    wait_log(log, "processor_starting", timeout=120)  # start-up is slow on a loaded machine

    # 1. the built-in rules do not know the line: the exit code decides -> fail
    job1 = f"before-{uuid.uuid4().hex[:6]}"
    feed_failure(kafka_bootstrap, topic_prefix, job1)
    d1 = one_decision(kafka_bootstrap, topic_prefix, job1)
    assert (d1["action"], d1["reason"]["kind"]) == ("fail", "exit"), d1
    builtin_version = d1["rules_version"]

    # 2. push a rule set that makes the line retryable: a new job restarts, same processor
    site = tmp_path / "site.yaml"
    site.write_text(RETRYABLE)
    out = fw("rules", "push", str(site), "--bootstrap", kafka_bootstrap,
             "--topic-prefix", topic_prefix)
    assert out.returncode == 0, out.stderr
    pushed = rules_version_of(out.stdout)
    assert pushed != builtin_version
    wait_log(log, f"event=rules_loaded version={pushed}")
    job2 = f"after-{uuid.uuid4().hex[:6]}"
    feed_failure(kafka_bootstrap, topic_prefix, job2)
    d2 = one_decision(kafka_bootstrap, topic_prefix, job2)
    assert d2["action"] == "restart", d2
    assert d2["reason"]["rule"] == "site.flux-overheat", d2
    assert d2["rules_version"] == pushed

    # 3. a broken set written around `rules push` is refused; the last good set stays
    broken = orjson.dumps({"v": 1, "version": "bogus", "pushed_at": time.time(),
                           "builtin": True, "files": [{"name": "broken.yaml",
                                                       "text": BROKEN}]})
    asyncio.run(publish_record(kafka_bootstrap, Topics(topic_prefix).rules, broken))
    text = wait_log(log, "event=rules_rejected")
    rejected = next(ln for ln in text.splitlines() if "event=rules_rejected" in ln)
    assert "broken.yaml:5:" in rejected and "broken.yaml:4:" in rejected, rejected
    assert f"kept={pushed}" in rejected, rejected
    job3 = f"kept-{uuid.uuid4().hex[:6]}"
    feed_failure(kafka_bootstrap, topic_prefix, job3)
    d3 = one_decision(kafka_bootstrap, topic_prefix, job3)
    assert d3["action"] == "restart" and d3["rules_version"] == pushed, d3
    assert decisions(kafka_bootstrap, topic_prefix, job1) == [d1]  # nothing re-decided


def test_restarted_processor_starts_with_the_pushed_rules(kafka_bootstrap: str,
                                                          topic_prefix: str,
                                                          tmp_path: Path) -> None:
    site = tmp_path / "site.yaml"
    site.write_text(RETRYABLE)
    out = fw("rules", "push", str(site), "--bootstrap", kafka_bootstrap,
             "--topic-prefix", topic_prefix)
    assert out.returncode == 0, out.stderr
    pushed = rules_version_of(out.stdout)
    asyncio.run(ensure_topics(kafka_bootstrap, Topics(topic_prefix), 2))
    job = f"cold-{uuid.uuid4().hex[:6]}"
    feed_failure(kafka_bootstrap, topic_prefix, job)  # waiting before any processor runs
    log = tmp_path / "processor.log"
    with processor(kafka_bootstrap, topic_prefix, log, "--settle-s", "1") as proc:
        d = one_decision(kafka_bootstrap, topic_prefix, job)
        assert proc.poll() is None, log.read_text()
    assert d["action"] == "restart" and d["rules_version"] == pushed, d
