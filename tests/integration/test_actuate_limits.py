"""`faultwatch actuate --backend exec` against the real nodes topic: a storm of quarantines
drains at most the limit and holds the rest until an operator releases the hold; a permanent
error is reported once, not retried; a refused registry entry is logged once, not per tick."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import orjson
import pytest

from faultwatch.core.registry import NodeRecord, Reason
from faultwatch.kafka.admin import ensure_compacted_topic
from faultwatch.registry.store import write_records
from faultwatch.wire.topics import Topics
from tests.support.waiting import wait_until

pytestmark = pytest.mark.kafka

# the drain "command": appends its arguments to a file; exits 77 (EX_NOPERM) for nodes
# named deny-* (a scheduler's permission error)
DRAIN = ('case "$1" in deny-*) echo "permission denied: $1" >&2; exit 77;; esac; '
         'echo "$1" >> "$0"')


def quarantined(node: str, i: int, until: float | None = None) -> NodeRecord:
    now = time.time()
    return NodeRecord(node=node, state="quarantined", until=until or now + 3600, strikes=1,
                      reasons=(Reason(ts=now, event="quarantine", decision=f"d{i}",
                                      rule="xid-79", job="train"),), updated_ts=now)


class Actuate:
    def __init__(self, bootstrap: str, prefix: str, tmp: Path, *extra: str) -> None:
        self.out, self.log = tmp / "drained.txt", tmp / "actuate.log"
        self.state = tmp / "state.jsonl"
        tpl = orjson.dumps(["/bin/sh", "-c", DRAIN, str(self.out), "{node}"]).decode()
        self.env = dict(os.environ, FAULTWATCH_BOOTSTRAP=bootstrap,
                        FAULTWATCH_TOPIC_PREFIX=prefix)
        self.env.pop("FAULTWATCH_DECISION_KEY", None)
        with open(self.log, "wb") as fh:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "faultwatch", "actuate", "--backend", "exec",
                 "--exec-quarantine", tpl, "--state-file", str(self.state), *extra],
                stdout=fh, stderr=subprocess.STDOUT, env=self.env, start_new_session=True)

    def drained(self) -> list[str]:
        return self.out.read_text().splitlines() if self.out.exists() else []

    def text(self) -> str:
        assert self.proc.poll() is None, self.log.read_text()[-3000:]
        return self.log.read_text()

    def stop(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            self.proc.wait(30)


@pytest.fixture
def actuate(kafka_bootstrap: str, topic_prefix: str, tmp_path: Path) -> Iterator[Actuate]:
    asyncio.run(ensure_compacted_topic(kafka_bootstrap, Topics(topic_prefix).nodes))
    a = Actuate(kafka_bootstrap, topic_prefix, tmp_path, "--fleet-nodes", "1000")
    wait_until(lambda: "event=actuate_started" in a.text(), 60, "actuate_started")
    yield a
    a.stop()


def test_a_storm_of_quarantines_drains_the_limit_holds_the_rest_until_released(
        kafka_bootstrap: str, topic_prefix: str, actuate: Actuate) -> None:
    nodes = [f"gpu-{i:03d}" for i in range(200)]
    asyncio.run(write_records(kafka_bootstrap, Topics(topic_prefix).nodes,
                              [quarantined(n, i) for i, n in enumerate(nodes)]))
    wait_until(lambda: "event=actuate_hold " in actuate.text(), 60, "the hold")
    wait_until(lambda: len(actuate.drained()) >= 5, 30, "the first drains")  # positive control
    hold = orjson.loads(actuate.state.with_name("state.jsonl.hold").read_bytes())
    assert hold["nodes"] and "release-hold" in hold["release"]
    time.sleep(2)  # the limits hold: no sixth drain however long we look (5 s of ticks)
    assert len(actuate.drained()) == 5, actuate.drained()
    assert actuate.text().count("event=actuate_hold ") == 1
    assert "--release-hold" in actuate.text()

    rel = subprocess.run([sys.executable, "-m", "faultwatch", "actuate", "--backend", "exec",
                          "--state-file", str(actuate.state), "--release-hold"],
                         capture_output=True, env=actuate.env, timeout=60)
    assert rel.returncode == 0, rel.stderr.decode()
    assert b"gpu-" in rel.stdout
    wait_until(lambda: len(actuate.drained()) == 200, 120, "every node drained after release")
    assert sorted(actuate.drained()) == nodes
    assert "event=actuate_hold_released" in actuate.text()


def test_a_permanent_error_is_reported_once_and_a_refused_entry_logged_once(
        kafka_bootstrap: str, topic_prefix: str, actuate: Actuate) -> None:
    past = time.time() - 10  # expired: planned again on every tick
    asyncio.run(write_records(kafka_bootstrap, Topics(topic_prefix).nodes, [
        quarantined("deny-1", 1), quarantined("bad;node", 2, until=past),
        quarantined("ok-1", 3)]))
    wait_until(lambda: actuate.drained() == ["ok-1"], 60, "ok-1 drained")  # positive control
    wait_until(lambda: "event=actuate_failed" in actuate.text(), 30, "the permanent error")
    time.sleep(3)  # six more ticks
    text = actuate.text()
    assert text.count("event=actuate_failed") == 1 and "permission denied" in text
    assert "event=actuate_retry" not in text and "event=actuate_gave_up" not in text
    assert text.count("event=actuate_node_rejected") == 1, text
