"""`faultwatch rules push` and hot reload in a running processor, on a real broker."""

from __future__ import annotations

import asyncio
import re
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import orjson
import pytest

from faultwatch.errors import EXIT_RULES
from faultwatch.kafka.admin import ensure_topics
from faultwatch.rollout.rules_push import publish_record
from faultwatch.rollout.rules_record import RULESET_KEY
from faultwatch.wire.topics import Topics
from tests.support.cluster import decisions, processor, wait_log
from tests.support.kafka import read_topic
from tests.support.processes import fw
from tests.support.pushed_rules import RETRYABLE, feed_failure, one_decision, rules_version_of

pytestmark = pytest.mark.kafka


BROKEN = """\
version: 1
rules:
  - id: site.broken
    category: retriable
    regex: "(unclosed"
    descripton: a typo
"""


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
    assert "as revision 1" in out.stdout
    recs = read_topic(kafka_bootstrap, Topics(topic_prefix).rules)
    # the set in force, after its copy as revision 1 (`rules history`, `rules rollback`)
    assert [r.key for r in recs] == [b"revision/1", RULESET_KEY]
    assert recs[0].value == recs[1].value
    d = orjson.loads(recs[1].value)
    assert d["v"] == 1 and d["version"] == version and d["builtin"] is True
    assert d["files"] == [{"name": "site.yaml", "text": RETRYABLE}] and d["revision"] == 1


@pytest.fixture
def running_processor(kafka_bootstrap: str, topic_prefix: str,
                      tmp_path: Path) -> Iterator[Path]:
    log = tmp_path / "processor.log"
    with processor(kafka_bootstrap, topic_prefix, log, "--settle-s", "1") as proc:
        time.sleep(2.0)
        assert proc.poll() is None, log.read_text()
        yield log
        assert proc.poll() is None, f"processor died:\n{log.read_text()[-4000:]}"


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
