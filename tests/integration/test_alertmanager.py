"""`faultwatch notify --alertmanager` against a real Alertmanager (Debian's, with the routes of
deploy/alertmanager/alertmanager.yml) and a real broker: decisions become alerts with their
labels and annotations, two of one job are grouped into one notification, a silence made
through Alertmanager's API suppresses a job's alert, open alerts are re-sent, and an alert
resolves when the status topic shows its job's next attempt making progress."""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson
import pytest

from faultwatch import wire
from faultwatch.kafka.admin import ensure_topics
from faultwatch.notify import alertmanager as receiver
from faultwatch.notify.alerts import AlertPolicy, rfc3339
from faultwatch.notify.sender import RetryPolicy
from faultwatch.notify.service import Notifier, NotifierConfig
from faultwatch.trust.records import DecisionGate
from faultwatch.wire.topics import Topics
from tests.support import alertmanager
from tests.support.notify import Hook, dec, publish
from tests.support.waiting import wait_until_async

pytestmark = pytest.mark.kafka

NASTY = "RuntimeError: NCCL error \x1b[31m<!channel> see http://evil.example/x " + "y" * 400


@pytest.fixture(scope="module")
def am(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[alertmanager.Alertmanager,
                                                                    Hook]]:
    why = alertmanager.missing()
    if why:
        pytest.fail(why)
    hook = Hook()
    manager = alertmanager.Alertmanager(tmp_path_factory.mktemp("alertmanager"), hook.url)
    try:
        yield manager, hook
    finally:
        manager.stop()
        hook.server.shutdown()


def _notices(hook: Hook, job: str, status: str = "firing") -> list[dict[str, Any]]:
    """Alertmanager's webhook notifications about `job` with that status."""
    return [b for _, b in hook.accepted()
            if b.get("groupLabels", {}).get("job") == job and b.get("status") == status]


async def _snapshot(bootstrap: str, topic: str, job: str, attempt: int, steps: int) -> None:
    from aiokafka import AIOKafkaProducer

    p = AIOKafkaProducer(bootstrap_servers=bootstrap, acks="all")
    await p.start()
    try:
        await p.send_and_wait(topic, wire.encode_status(
            {"job": job, "run_id": "r1", "attempt": attempt, "phase": "running",
             "steps": steps, "ts": time.time()}), key=job.encode())
    finally:
        await p.stop()


def test_decisions_become_alerts_that_group_silence_resend_and_resolve(
        kafka_bootstrap: str, topic_prefix: str, am: tuple[alertmanager.Alertmanager, Hook],
        tmp_path: Path) -> None:
    manager, hook = am
    topics = Topics(topic_prefix)
    asyncio.run(ensure_topics(kafka_bootstrap, topics, 1))
    u = uuid.uuid4().hex[:6]
    job, quiet, loud = f"train-{u}", f"quiet-{u}", f"loud-{u}"
    now = time.time()
    silence = manager.api("silences", {
        "matchers": [{"name": "job", "value": quiet, "isRegex": False, "isEqual": True}],
        "startsAt": rfc3339(now - 1), "endsAt": rfc3339(now + 3600),
        "createdBy": "test", "comment": "maintenance of quiet"})["silenceID"]
    error = {**dec(job, 0), "run_id": "r1", "targets": {"nodes": ["n1"], "ranks": [3]},
             "evidence": {"first_error": {"node": "n1", "rank": 3, "line": NASTY}}}
    hang = {**dec(job, 0, kind="hang"), "run_id": "r1",
            "targets": {"nodes": ["n2"], "ranks": []}}
    events: list[tuple[str, dict[str, Any]]] = []

    async def main() -> None:
        cfg = NotifierConfig(
            bootstrap=kafka_bootstrap, topic=topics.decisions, receivers=(),
            group_id=f"g{u}", from_beginning=True,
            retry=RetryPolicy(attempts=3, base_s=0.2, max_s=1.0),
            alertmanagers=(receiver.Alertmanager(manager.url),),
            alert_policy=AlertPolicy(resend_s=1.0), status_topic=topics.status,
            replay_state=tmp_path / "seen")
        stop = asyncio.Event()
        task = asyncio.create_task(Notifier(cfg, DecisionGate(None, lambda e, **f: None),
                                            lambda e, **f: events.append((e, f))).run(stop))
        await publish(kafka_bootstrap, topics.decisions,
                      [error, hang, dec(quiet, 0, action="fail"), dec(loud, 0, action="fail")])

        # the alerts, with labels that route and annotations that are inert and bounded
        held = await wait_until_async(lambda: manager.alerts(job), 60, "the job's two alerts",
                                      until=lambda a: len(a) == 2)
        by_kind = {a["labels"]["kind"]: a for a in held}
        assert by_kind["error"]["labels"] == {
            "alertname": "FaultwatchJobRestart", "job": job, "node": "n1",
            "action": "restart", "kind": "error", "rule": "nccl.timeout",
            "category": "retryable", "severity": "warning"}
        assert by_kind["hang"]["labels"]["node"] == "n2"
        notes = by_kind["error"]["annotations"]
        assert notes["logs"] == f"faultwatch logs {job} --attempt 0"
        assert notes["first_error_where"] == "node n1 rank 3"
        line = notes["first_error"]
        assert line.startswith("RuntimeError: NCCL error") and len(line) <= 300
        assert "\x1b" not in line and "<!channel>" not in line and "http://" not in line
        assert by_kind["error"]["startsAt"].startswith(rfc3339(error["ts"])[:19])

        # grouped by the shipped route (group_by: [job]): one notification, both alerts
        grouped = await wait_until_async(lambda: _notices(hook, job), 60,
                                         "Alertmanager's notification of the job")
        assert {a["labels"]["kind"] for a in grouped[0]["alerts"]} == {"error", "hang"}
        assert grouped[0]["receiver"] == "ml-platform"

        # the silence: `quiet` is suppressed; `loud` (the control) pages
        await wait_until_async(lambda: _notices(hook, loud), 60, "the control's page")
        assert _notices(hook, loud)[0]["receiver"] == "ml-platform-pager"
        (q,) = manager.alerts(quiet)
        assert q["status"]["state"] == "suppressed" and q["status"]["silencedBy"] == [silence]
        assert not _notices(hook, quiet)

        # open alerts are re-sent: Alertmanager's endsAt moves on
        first_end = by_kind["error"]["endsAt"]
        await wait_until_async(
            lambda: [a["endsAt"] for a in manager.alerts(job) if a["labels"]["kind"] == "error"],
            30, "a re-send", until=lambda e: e and e[0] > first_end)

        # the next attempt's first progress resolves both (the processor refreshes the
        # snapshot of an active job every few seconds: so does this test)
        async def resolved() -> bool:
            await _snapshot(kafka_bootstrap, topics.status, job, 1, 3)
            return not manager.alerts(job) and bool(_notices(hook, job, "resolved"))

        await wait_until_async(resolved, 60, "the alerts to resolve", interval_s=1.0)
        done = _notices(hook, job, "resolved")[-1]
        assert {a["status"] for a in done["alerts"]} == {"resolved"}
        assert manager.alerts(loud) and manager.alerts(quiet)  # other jobs stay open
        stop.set()
        await asyncio.wait_for(task, 30)

    asyncio.run(main())
    names = [e for e, _ in events]
    assert "alert_resolved" in names and "alerts_failed" not in names, names
    assert {f["job"] for e, f in events if e == "alert_resolved"} == {job}
    assert orjson.dumps(events)  # every event is plain data
