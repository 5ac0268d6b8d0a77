"""Following a whole topic with no consumer group: to its end, then live; broker errors retried."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from faultwatch.eventlog import log_event
from faultwatch.kafka import clients
from faultwatch.kafka.errors import BROKER_ERRORS

RETRY_FIRST_S, RETRY_MAX_S = 1.0, 30.0  # the wait after a broker error, doubled up to the max
POLL_MS = 500
RETRY_BACKOFF_MS = 1000  # aiokafka retries at most once a second while the broker is away


class Backoff:
    """The wait after a broker error: `first_s`, doubled after each failure up to `max_s`,
    back to `first_s` once a poll succeeds."""

    def __init__(self, first_s: float = RETRY_FIRST_S, max_s: float = RETRY_MAX_S) -> None:
        self.first_s, self.max_s = first_s, max_s
        self.s = first_s  # the wait the next failure gets

    def failed(self) -> float:
        """The wait for this failure; the next one waits twice as long (up to `max_s`)."""
        wait, self.s = self.s, min(self.max_s, self.s * 2)
        return wait

    def reset(self) -> None:
        self.s = self.first_s


def read_to_end(positions: Mapping[Any, int], end: Mapping[Any, int]) -> bool:
    """True once every partition's position reached its end offset taken when reading began."""
    return all(positions[tp] >= end[tp] for tp in end)


class CatchesUp(Protocol):
    caught_up: bool  # the records there were when reading began have all been read


@dataclass
class Flag:
    caught_up: bool = False


class TopicFollower:
    """Folds every partition of one topic into something for the life of a task. Subclasses
    say what a batch does (`take`), where reading starts (`seek`) and what a loaded topic logs
    (`loaded`); `into.caught_up` (a table's own flag, or the follower's) is set once the
    records there were when reading began have all been read."""

    client = "follower"  # its consumers' client id: faultwatch-<client>-<6 hex digits>
    following_event: str | None = None  # logged with the partition count once positioned
    failed_event = "follow_failed"  # logged at each broker error, with the wait

    def __init__(self, bootstrap: str, topic: str, into: CatchesUp | None = None) -> None:
        self.bootstrap, self.topic = bootstrap, topic
        self.into: CatchesUp = into if into is not None else Flag()
        self.backoff = Backoff()

    @property
    def caught_up(self) -> bool:
        return self.into.caught_up

    @caught_up.setter
    def caught_up(self, value: bool) -> None:
        self.into.caught_up = value

    async def prepare(self) -> None:
        """Before each consumer starts (e.g. create the topic)."""

    async def partitions(self, consumer: Any, stop: asyncio.Event) -> set[int]:
        """The topic's partitions, from metadata asked for now (a group-less consumer just
        started knows no topic yet); none: the consumer stops and a new one tries again
        after the backoff (the topic does not exist yet)."""
        await consumer._client.force_metadata_update()  # noqa: SLF001 - no public call
        return set(consumer.partitions_for_topic(self.topic) or ())

    async def seek(self, consumer: Any, tps: list[Any]) -> None:
        """Where reading starts on each (re)start: the beginning."""
        await consumer.seek_to_beginning(*tps)

    async def take(self, batch: Mapping[Any, list[Any]]) -> None:
        """Fold one batch of records (partition -> records)."""
        raise NotImplementedError

    def loaded(self) -> None:
        """Once the topic was read to its end (log what it holds)."""

    async def run(self, stop: asyncio.Event | None = None) -> None:
        """Follow until `stop` is set (or the task is cancelled)."""
        stop = stop or asyncio.Event()
        while not stop.is_set():
            consumer: Any = None
            try:
                await self.prepare()
                consumer = clients.consumer(
                    bootstrap_servers=self.bootstrap, group_id=None, enable_auto_commit=False,
                    client_id=f"faultwatch-{self.client}-{uuid.uuid4().hex[:6]}",
                    retry_backoff_ms=RETRY_BACKOFF_MS)
                await consumer.start()
                parts = await self.partitions(consumer, stop)
                if not parts:
                    consumer, stopping = None, consumer
                    await stop_consumer(stopping)
                    await _wait(stop, self.backoff.s)
                    continue
                await self._follow(consumer, parts, stop)
            except asyncio.CancelledError:
                raise
            except BROKER_ERRORS as e:
                wait = self.backoff.failed()
                log_event(self.failed_event, topic=self.topic, retry_in_s=wait,
                          error=f"{type(e).__name__}: {e}")
                await _wait(stop, wait)
            finally:
                if consumer is not None:
                    await stop_consumer(consumer)

    async def _follow(self, consumer: Any, parts: set[int], stop: asyncio.Event) -> None:
        from aiokafka import TopicPartition

        tps = [TopicPartition(self.topic, p) for p in sorted(parts)]
        consumer.assign(tps)
        await self.seek(consumer, tps)
        end = await consumer.end_offsets(tps)
        if self.following_event:
            log_event(self.following_event, topic=self.topic, partitions=len(tps))
        while not stop.is_set():
            await self.take(await consumer.getmany(timeout_ms=POLL_MS))
            if not self.caught_up and read_to_end(
                    {tp: await consumer.position(tp) for tp in tps}, end):
                self.caught_up = True
                self.loaded()
            self.backoff.reset()


async def stop_consumer(consumer: Any) -> None:
    """Stop a consumer, even one started a moment ago: aiokafka 0.14's group-less consumer
    stopped before its coordinator's task first ran awaits that task, cancelled unstarted,
    and raises CancelledError. One turn of the loop first lets the task start; such a
    CancelledError (not this task's own cancellation) is not passed on."""
    await asyncio.sleep(0)
    try:
        await consumer.stop()
    except asyncio.CancelledError:
        task = asyncio.current_task()
        if task is not None and task.cancelling():
            raise


async def _wait(stop: asyncio.Event, seconds: float) -> None:
    """Sleep `seconds`, or less if `stop` is set meanwhile."""
    try:
        await asyncio.wait_for(stop.wait(), seconds)
    except TimeoutError:
        pass
