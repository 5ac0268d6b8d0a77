"""`faultwatch notify` against real Kafka and a real local HTTP server: grouping, retries."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson
import pytest

from faultwatch.notify.grouping import GroupingPolicy
from faultwatch.notify.sender import Receiver, RetryPolicy
from faultwatch.notify.service import Notifier, NotifierConfig
from faultwatch.trust.records import DecisionGate
from faultwatch.wire import signing
from faultwatch.wire.signing import Key, Keyring
from tests.support.notify import Hook, dec, publish
from tests.support.waiting import wait_until_async

pytestmark = pytest.mark.kafka


@pytest.fixture
def hook() -> Iterator[Hook]:
    h = Hook()
    yield h
    h.server.shutdown()


def config(bootstrap: str, topic: str, url: str, **policy: float) -> NotifierConfig:
    return NotifierConfig(
        bootstrap=bootstrap, topic=topic, receivers=(Receiver(url),),
        group_id=f"g{uuid.uuid4().hex[:8]}", from_beginning=True,
        policy=GroupingPolicy(**{"group_wait_s": 2.0, "group_interval_s": 4.0, **policy}),
        retry=RetryPolicy(attempts=5, base_s=0.2, max_s=2.0))


def test_a_restart_storm_sends_one_grouped_message_then_follow_ups(
        kafka_bootstrap: str, topic_prefix: str, hook: Hook) -> None:
    topic = f"{topic_prefix}decisions"
    events: list[tuple[str, dict[str, Any]]] = []

    async def main() -> None:
        notifier = Notifier(config(kafka_bootstrap, topic, hook.url),
                            DecisionGate(None, lambda e, **f: None),
                            lambda e, **f: events.append((e, f)))
        stop = asyncio.Event()
        task = asyncio.create_task(notifier.run(stop))
        for part in range(3):  # the storm arrives in waves while the notifier runs
            await publish(kafka_bootstrap, topic, [dec("storm", i)
                                                   for i in range(part * 20, part * 20 + 20)])
        await publish(kafka_bootstrap, topic, [dec("calm", 0, kind="hang")])
        await wait_until_async(lambda: len(hook.accepted()) >= 2, 60, "the first two messages")
        first = {b["group_key"]: (t, b) for t, b in hook.accepted()}
        t_storm, storm = first["job=storm,kind=error"]
        assert storm["reason"] == "initial" and storm["firing"] == 60
        assert len(storm["new_ids"]) == 60 and len(storm["decisions"]) == 20
        assert first["job=calm,kind=hang"][1]["firing"] == 1
        await publish(kafka_bootstrap, topic, [dec("storm", i) for i in range(60, 70)]
                      + [dec("storm", 5)])  # one duplicate id among them
        await wait_until_async(lambda: len(hook.accepted()) >= 3, 60, "the follow-up")
        t_next, follow = hook.accepted()[2]
        assert follow["group_key"] == "job=storm,kind=error" and follow["reason"] == "update"
        assert len(follow["new_ids"]) == 10 and follow["total"] == 70
        assert t_next - t_storm >= 4.0 - 0.5  # not before group_interval
        stop.set()
        await asyncio.wait_for(task, 30)

    asyncio.run(main())
    assert len(hook.accepted()) == 3  # 71 decisions, 3 messages
    assert [e for e, _ in events].count("notification_sent") == 3


def test_a_500_is_retried_with_backoff_until_accepted(
        kafka_bootstrap: str, topic_prefix: str) -> None:
    hook = Hook(fail=2, status=503)
    topic = f"{topic_prefix}decisions"
    events: list[tuple[str, dict[str, Any]]] = []
    try:
        async def main() -> None:
            await publish(kafka_bootstrap, topic, [dec("flaky", 0, action="fail")])
            stop = asyncio.Event()
            task = asyncio.create_task(
                Notifier(config(kafka_bootstrap, topic, hook.url, group_wait_s=0.0),
                         DecisionGate(None, lambda e, **f: None),
                         lambda e, **f: events.append((e, f))).run(stop))
            await wait_until_async(lambda: len(hook.accepted()) >= 1, 60, "the accepted retry")
            stop.set()
            await asyncio.wait_for(task, 30)

        asyncio.run(main())
    finally:
        hook.server.shutdown()
    assert [c for _, c, _ in hook.posts] == [503, 503, 200]
    bodies = {orjson.dumps(b["new_ids"]) for _, _, b in hook.posts}
    assert len(bodies) == 1  # the same message each time
    retries = [f for e, f in events if e == "notification_retry"]
    assert [r["status"] for r in retries] == [503, 503]
    assert retries[0]["retry_in_s"] < retries[1]["retry_in_s"]  # backoff grows


def test_with_a_key_only_signed_decisions_are_notified(
        kafka_bootstrap: str, topic_prefix: str, hook: Hook) -> None:
    ring = Keyring((Key("k1", b"notify-test-secret-0123"),))
    topic = f"{topic_prefix}decisions"
    events: list[tuple[str, dict[str, Any]]] = []

    async def main() -> None:
        forged = signing.sign(dec("forged", 0, action="fail"),
                              Keyring((Key("k1", b"attacker-secret-0123456"),)))
        await publish(kafka_bootstrap, topic, [dec("unsigned", 0, action="fail"), forged,
                                               signing.sign(dec("real", 0, action="fail"),
                                                            ring)])
        stop = asyncio.Event()
        task = asyncio.create_task(
            Notifier(config(kafka_bootstrap, topic, hook.url, group_wait_s=0.5),
                     DecisionGate(ring, lambda e, **f: events.append((e, f))),
                     lambda e, **f: None).run(stop))
        await wait_until_async(lambda: len(hook.accepted()) >= 1, 60,
                               "the signed decision's message")
        stop.set()
        await asyncio.wait_for(task, 30)

    asyncio.run(main())
    assert [b["group_key"] for _, b in hook.accepted()] == ["job=real,kind=error"]
    refused = {f["job"]: f["reason"] for e, f in events if e == "decision_refused"}
    assert refused == {"unsigned": "unsigned", "forged": "bad_signature"}


def test_the_notify_command_runs_until_sigterm(kafka_bootstrap: str, topic_prefix: str,
                                               hook: Hook, tmp_path: Path) -> None:
    topic = f"{topic_prefix}decisions"
    asyncio.run(publish(kafka_bootstrap, topic, [dec("cli", i) for i in range(5)]))
    env = {**os.environ, "FAULTWATCH_BOOTSTRAP": kafka_bootstrap}
    env.pop("FAULTWATCH_DECISION_KEY", None)
    p = subprocess.Popen([sys.executable, "-m", "faultwatch", "notify", "--topic-prefix",
                          topic_prefix, "--webhook", f"slack={hook.url}", "--group-wait-s", "1",
                          "--from-beginning", "--group-id", f"g{uuid.uuid4().hex[:8]}"],
                         env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        asyncio.run(wait_until_async(lambda: len(hook.accepted()) >= 1, 60, "the slack message"))
    finally:
        p.send_signal(signal.SIGTERM)
        _, err = p.communicate(timeout=60)
    assert p.returncode == 0, err.decode()[-3000:]
    [(_, body)] = hook.accepted()
    assert body["text"].startswith("[faultwatch] job=cli,kind=error: 5 decision(s)")
    assert b"event=notification_sent" in err and b"event=decisions_unverified" in err
