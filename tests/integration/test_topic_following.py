"""Following a whole topic (kafka/following.py) on the real broker: the records there at the
start are read as history on every partition, the follower is caught up once (after the last
of them), and a record written later is taken live; with no broker, each failed start is
logged with a wait that doubles, and `stop` ends the wait at once."""

from __future__ import annotations

import asyncio
import socket
import time
import uuid
from collections.abc import Mapping
from typing import Any

import pytest

from faultwatch.kafka import following
from faultwatch.kafka.following import TopicFollower
from tests.support.kafka import produce_records
from tests.support.waiting import wait_until_async

pytestmark = pytest.mark.kafka


class Collect(TopicFollower):
    client = "test-following"
    following_event = "registry_following"
    failed_event = "registry_follow_failed"

    def __init__(self, bootstrap: str, topic: str) -> None:
        super().__init__(bootstrap, topic)
        self.taken: list[tuple[bytes, bool]] = []  # (value, caught up when taken)
        self.loads: list[int] = []  # how many records were taken at each loaded()

    async def take(self, batch: Mapping[Any, list[Any]]) -> None:
        self.taken += [(m.value, self.caught_up) for msgs in batch.values() for m in msgs]

    def loaded(self) -> None:
        self.loads.append(len(self.taken))


def test_history_on_every_partition_then_caught_up_once_then_live(kafka_bootstrap: str) -> None:
    from aiokafka.admin import AIOKafkaAdminClient, NewTopic

    topic = f"follow-{uuid.uuid4().hex[:8]}"
    history = [(f"k{i}".encode(), f"old{i}".encode()) for i in range(8)]

    async def main() -> None:
        admin = AIOKafkaAdminClient(bootstrap_servers=kafka_bootstrap)
        await admin.start()
        try:
            await admin.create_topics([NewTopic(topic, 3, 1)])
        finally:
            await admin.close()
        await produce_records(kafka_bootstrap, topic, history)
        f, stop = Collect(kafka_bootstrap, topic), asyncio.Event()
        task = asyncio.create_task(f.run(stop))
        try:
            await wait_until_async(lambda: f.loads, 30, "caught up")
            assert f.loads == [len(history)]  # only once all of the history was taken
            assert sorted(v for v, _ in f.taken) == sorted(v for _, v in history)
            assert not any(live for _, live in f.taken)
            await produce_records(kafka_bootstrap, topic, [(b"k9", b"new")])
            await wait_until_async(lambda: len(f.taken) > len(history), 30, "the live record")
            assert f.taken[-1] == (b"new", True) and f.loads == [len(history)]
        finally:
            stop.set()
            await asyncio.wait_for(task, 10)

    asyncio.run(main())


def test_without_a_broker_each_failure_waits_twice_as_long(monkeypatch: pytest.MonkeyPatch
                                                           ) -> None:
    events: list[tuple[str, dict[str, Any]]] = []
    monkeypatch.setattr(following, "log_event", lambda e, **kw: events.append((e, kw)))
    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        nobody = f"127.0.0.1:{s.getsockname()[1]}"

    async def main() -> float:
        f, stop = Collect(nobody, "nowhere"), asyncio.Event()
        task = asyncio.create_task(f.run(stop))
        await wait_until_async(lambda: len(events) >= 2, 30, "two failed starts")
        t0 = time.monotonic()
        stop.set()  # during the second wait (2 s)
        await asyncio.wait_for(task, 10)
        return time.monotonic() - t0

    stopped_in_s = asyncio.run(main())
    assert [e for e, _ in events] == ["registry_follow_failed"] * 2
    assert [kw["retry_in_s"] for _, kw in events] == [1.0, 2.0]
    assert all(kw["topic"] == "nowhere" and "Error" in kw["error"] for _, kw in events)
    assert stopped_in_s < 1.5


def test_a_consumer_stopped_right_after_its_start_stops_cleanly(kafka_bootstrap: str) -> None:
    from faultwatch.kafka import clients

    async def main() -> bool:
        c = clients.consumer(bootstrap_servers=kafka_bootstrap, group_id=None,
                             enable_auto_commit=False)
        await c.start()
        await following.stop_consumer(c)  # aiokafka 0.14's plain stop raises CancelledError
        me = asyncio.current_task()
        closed = c._client._sync_task is None  # noqa: SLF001 - closed last: stopped whole
        return me is not None and not me.cancelling() and closed

    assert asyncio.run(main())
