"""`faultwatch actuate --backend exec` on the real broker: signed decisions only, each once,
bad records and bad fields skipped; the exec backend runs argv templates (no shell)."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import orjson
import pytest

from faultwatch.core.events import Decision
from faultwatch.kafka.admin import ensure_topics
from faultwatch.wire import decision_to_dict
from faultwatch.wire.incidents import decode_acted
from faultwatch.wire.signing import encode, parse_keys
from faultwatch.wire.topics import Topics
from tests.support.kafka import consume, produce
from tests.support.waiting import wait_until

pytestmark = pytest.mark.kafka

KEY = "k1:0123456789abcdef0123456789"
OTHER = "k1:ffffffffffffffffffffffffffff"  # same key id, wrong secret: a forgery
RECORD = ("import sys; open(sys.argv[1], 'a').write(' '.join(sys.argv[2:]) + '\\n')")


def _blacklist(did: str, node: str) -> dict[str, object]:
    return decision_to_dict(Decision(id=did, job="train", attempt=0, action="blacklist",
                                     kind="error", ts=time.time(), nodes=(node,),
                                     rule="nvidia-fallen-off-bus", category="hardware"))


def test_actuate_acts_once_on_signed_decisions_and_refuses_forged_ones(
        kafka_bootstrap: str, topic_prefix: str, tmp_path: Path) -> None:
    topics = Topics(topic_prefix)
    asyncio.run(ensure_topics(kafka_bootstrap, topics, 1))
    out = tmp_path / "acted.txt"
    log = tmp_path / "actuate.log"
    tpl = orjson.dumps([sys.executable, "-c", RECORD, str(out), "{kind}", "{node}",
                        "{decision}"]).decode()
    env = dict(os.environ, FAULTWATCH_DECISION_KEY=KEY, FAULTWATCH_BOOTSTRAP=kafka_bootstrap,
               FAULTWATCH_TOPIC_PREFIX=topic_prefix)
    with open(log, "wb") as fh:
        proc = subprocess.Popen([sys.executable, "-m", "faultwatch", "actuate", "--backend", "exec",
                                 "--exec-quarantine", tpl, "--state-file",
                                 str(tmp_path / "state.jsonl")],
                                stdout=fh, stderr=subprocess.STDOUT, env=env,
                                start_new_session=True)
    try:
        ring, forger = parse_keys(KEY, "test"), parse_keys(OTHER, "test")
        good = _blacklist("good1", "gpu-7")
        produce(kafka_bootstrap, topics.decisions, b"train", [
            encode(_blacklist("forged1", "gpu-1"), forger),
            orjson.dumps(_blacklist("unsigned1", "gpu-2")),
            b"{not json",
            encode(_blacklist("badnode1", "gpu-3;reboot"), ring),
            encode(good, ring), encode(good, ring)])  # published twice (at least once)
        def acted() -> str:
            assert proc.poll() is None, log.read_text()
            return out.read_text() if out.exists() else ""

        wait_until(acted, 60, "good1 acted on", interval_s=0.2,
                   until=lambda text: "good1" in text, detail=log.read_text)
        # the last record after the duplicate: once it is handled, the duplicate was too
        produce(kafka_bootstrap, topics.decisions, b"train",
                [encode(_blacklist("good2", "gpu-8"), ring)])
        wait_until(acted, 60, "good2 acted on", interval_s=0.2,
                   until=lambda text: "good2" in text, detail=log.read_text)
        assert out.read_text().splitlines() == ["quarantine gpu-7 good1",
                                                "quarantine gpu-8 good2"]
        # what it did is published for reports (docs/goodput.md): each action once
        done = consume(kafka_bootstrap, topics.acted, lambda recs: len(recs) >= 4)
        assert sorted((d["decision"], d["node"], d["action"]) for d in done) == [
            ("good1", "gpu-7", "quarantine"), ("good1", "gpu-7", "requeue"),
            ("good2", "gpu-8", "quarantine"), ("good2", "gpu-8", "requeue")], done
        assert {d["backend"] for d in done} == {"exec"}
        assert all(decode_acted(orjson.dumps(d)) for d in done)
        text = log.read_text()
        # forged, unsigned, not JSON; and the exact copy of good1 (the replay rule)
        assert text.count("event=decision_refused") == 4, text
        assert text.count("reason=replayed") == 1, text
        assert "actuate_decision_rejected" in text and "gpu-3;reboot" in text
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGTERM)
            proc.wait(20)
