"""Every use of a private faust-streaming 0.15 / aiokafka API, in one place (tested loudly)."""

from __future__ import annotations

import asyncio
import logging
import re
import time
import types
import weakref
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import faust
import faust.streams
from faust.sensors.monitor import Monitor
from faust.transport.consumer import CONSUMER_FETCHING
from faust.types import TP

from faultwatch.eventlog import log_event


def set_current_event(event: Any) -> None:
    """Make `event` Faust's current event in this task: table writes take their partition
    from it, and take_events() batches do not set it for the consumer's body."""
    faust.streams._current_event.set(weakref.ref(event))  # noqa: SLF001


def aiokafka_consumer(app: faust.App) -> tuple[Any, asyncio.AbstractEventLoop] | None:
    """The aiokafka consumer under Faust's consumer thread and the loop it runs on, or None
    when the worker has not started one."""
    thread = getattr(app.consumer, "_thread", None)
    consumer = getattr(thread, "_consumer", None) if thread is not None else None
    if consumer is None:
        return None
    return consumer, thread.thread_loop  # type: ignore[union-attr]


async def leave_group(app: faust.App) -> bool:
    """Close the worker's Kafka consumer on its own thread: aiokafka sends LeaveGroup, so the
    group rebalances at once instead of after the session timeout. Offsets are not committed
    here (Faust disables auto-commit); False when there was no consumer to close."""
    found = aiokafka_consumer(app)
    if found is None:
        return False
    consumer, loop = found
    await asyncio.wrap_future(asyncio.run_coroutine_threadsafe(consumer.stop(), loop))
    return True


class TableStore:
    """A job stage StateStore over a Faust table: reads from the table, writes to its local
    store and its changelog with the partition given (no current event needed, so timers,
    revocation and stop can write too)."""

    def __init__(self, table: Any) -> None:
        self.table = table

    def get(self, key: bytes) -> bytes | None:
        value: bytes | None = self.table.get(key)
        return value

    def put(self, partition: int, key: bytes, value: bytes) -> None:
        self.table.data[key] = value  # the local store, without Faust's changelog hook
        self.table.send_changelog(partition, key, value)

    def items(self) -> Any:
        return list(self.table.items())

    def delete(self, partition: int, key: bytes) -> None:
        self.table.data.pop(key, None)  # as put: the local store, then a changelog tombstone
        self.table.send_changelog(partition, key, None, value_serializer="raw")


def keep_queues_when_flowing(app: faust.App) -> None:
    """Faust's table recovery resumes the flow twice after a rebalance, and each resume
    clears every stream queue (mode's FlowControlEvent, clear_on_resume). Records fetched
    from the committed offsets between the two resumes (the first ones a worker reads of the
    partitions it took over: what the previous owner left unprocessed) were dropped while the
    fetcher had already moved past them: lost, or a hole that held the partition's commits
    back (faust-streaming issues #596, #606). A resume while the flow is already active now
    keeps the queues; the first resume after a suspension (a revocation) still clears what
    was fetched for the old assignment. Changelog records kept this way are applied once
    more (a table write is a key's value: idempotent)."""
    fc: Any = app.flow_control
    original = fc.resume

    def resume() -> None:
        if fc.is_active():
            return
        original()

    fc.resume = resume


def reread_uncommitted_partitions(app: faust.App, topics: set[str]) -> None:
    """After every rebalance Faust seeks to the committed offsets (perform_seek ->
    seek_to_committed), but aiokafka seeks only partitions whose committed offset is > 0:
    records of a partition without a commit that were fetched while Faust's flow was paused
    (table recovery) are dropped by the stream and never read again. Here such partitions
    of `topics` are sought to their beginning, the group's initial position anyway
    (auto_offset_reset=earliest): at worst records are read twice (at least once)."""
    consumer: Any = app.consumer
    original = consumer.seek_to_committed

    async def seek_to_committed() -> Any:
        committed = await original()
        fresh = [tp for tp, offset in committed.items() if not offset and tp.topic in topics]
        if fresh:  # the consumer thread's aiokafka seek (Faust's Consumer has none)
            await consumer._thread.seek_to_beginning(*fresh)  # noqa: SLF001
        return committed

    consumer.seek_to_committed = seek_to_committed


class QuietMonitor(Monitor):
    """Faust's monitor without its per-message and per-send statistics (counters, time
    stamps, latency deques: ~10 µs per record, read only by Faust's web views, which the
    processor does not serve; our metrics are faultwatch.metrics). Offsets, commits,
    rebalances and assignment are still tracked, and so is when a partition's stream last
    took an event (`stream_inbound_time`: Faust's consumer reads it to tell a stalled
    stream from a working one; without it every partition is reported as never started)."""

    def on_message_in(self, tp: Any, offset: int, message: Any) -> None:
        return None

    def on_stream_event_in(self, tp: Any, offset: int, stream: Any, event: Any) -> None:
        self.stream_inbound_time[tp] = time.monotonic()
        return None

    def on_stream_event_out(self, tp: Any, offset: int, stream: Any, event: Any,
                            state: Any = None) -> None:
        return None

    def on_message_out(self, tp: Any, offset: int, message: Any) -> None:
        return None

    def on_send_initiated(self, producer: Any, topic: str, message: Any, keysize: int,
                          valsize: int) -> None:
        return None

    def on_send_completed(self, producer: Any, state: Any, metadata: Any) -> None:
        return None

    def on_table_get(self, table: Any, key: Any) -> None:
        return None

    def on_table_set(self, table: Any, key: Any, value: Any) -> None:
        return None


def slow_retries(retry_backoff_ms: int) -> None:
    """Faust builds its aiokafka consumer and producer without `retry_backoff_ms` (aiokafka's
    default: 100 ms, every failed request of every client retried ten times a second while
    the broker is away): pass ours."""
    from faust.transport.drivers import aiokafka as driver

    thread_cls: Any = driver.AIOKafkaConsumerThread
    if getattr(thread_cls, "_fw_slow_retries", None) == retry_backoff_ms:
        return
    create = thread_cls._create_worker_consumer
    create_client = thread_cls._create_client_consumer

    def _slow(consumer: Any) -> Any:
        consumer._retry_backoff_ms = retry_backoff_ms  # noqa: SLF001 - read at start()
        consumer._client._retry_backoff = retry_backoff_ms / 1000  # noqa: SLF001
        return consumer

    def worker_consumer(self: Any, transport: Any) -> Any:
        return _slow(create(self, transport))

    def client_consumer(self: Any, transport: Any) -> Any:
        return _slow(create_client(self, transport))

    thread_cls._create_worker_consumer = worker_consumer
    thread_cls._create_client_consumer = client_consumer
    producer_cls: Any = driver.Producer
    extra = producer_cls._settings_extra

    def settings_extra(self: Any) -> Any:
        return {**extra(self), "retry_backoff_ms": retry_backoff_ms}

    producer_cls._settings_extra = settings_extra
    thread_cls._fw_slow_retries = retry_backoff_ms
    metadata_backoff()


def metadata_backoff() -> None:
    """A failed metadata update waits the client's retry backoff before it returns. aiokafka's
    producer, holding a batch for a partition whose leader it does not know (a broker that
    went away during its controlled shutdown reports no leaders), forces a metadata update
    and waits for it before it looks again; with the broker gone every update fails at once,
    and that loop took 66-94 % of a core for the whole outage (seen under load in
    tests/integration/test_processor_outage.py)."""
    from aiokafka.client import AIOKafkaClient

    client_cls: Any = AIOKafkaClient
    if getattr(client_cls, "_fw_metadata_backoff", False):
        return
    update = client_cls._metadata_update

    async def _metadata_update(self: Any, cluster_metadata: Any, topics: Any) -> Any:
        ok = await update(self, cluster_metadata, topics)
        if not ok:
            await asyncio.sleep(self._retry_backoff)  # noqa: SLF001 - seconds
        return ok

    client_cls._metadata_update = _metadata_update
    client_cls._fw_metadata_backoff = True


def direct_delivery(app: faust.App) -> None:
    """Faust's fetcher hands every fetched message to the streams through
    `Service.wait_first(callback(message), suspend_flow.wait())`: four tasks and an
    `asyncio.wait` per message (~100 µs of a loaded core each; records of 100 lines pay it
    per record), only so that a rebalance can abandon a delivery that waits. Here a
    message whose delivery cannot wait (the flow is not suspended, the producer buffer
    is below its bound, no channel queue of its partition is full and the conductor's
    callback map is not being rebuilt) is delivered by awaiting the callback directly;
    any other message takes Faust's own path. Everything else of the fetch loop is kept:
    read offsets, gaps of acked topics, commit_every, stop and crash handling."""
    consumer: Any = app.consumer
    if not hasattr(consumer, "_drain_messages") or not hasattr(consumer, "_read_offset"):
        raise RuntimeError("faust Consumer changed: no _drain_messages/_read_offset")
    consumer._drain_messages = types.MethodType(_drain_messages, consumer)
    consumer._fw_feeds = {}  # topic name -> BatchFeed (batch_feed)


class BatchFeed:
    """The messages of one topic, from Faust's fetcher straight to one batch consumer.

    Faust's own path costs per message: a conductor callback under a lock, an Event with
    its decoded key and value, a stream queue, the stream's per-event loop (processors,
    context variable, sensors) and, with take_events(), a processor call to buffer it and
    an ack per event through the event's refcount. Here the fetcher loop (`_drain_messages`)
    puts the raw ConsumerMessage into a queue of Faust's own kind (managed by the app's flow
    control: cleared when a rebalance suspends and resumes the flow, exactly as the stream
    queues are), and `batches()` hands whole lists of them to the consumer, which acks each
    message itself (`ack`) once the batch's outputs are delivered. What Faust keeps doing:
    the subscription (the topic is registered with the conductor as iterating a stream of
    it would), read offsets, gaps, acks -> commits, rebalances and the skip of messages
    fetched for an older generation or while the flow is suspended."""

    def __init__(self, app: faust.App, topic: Any, maxsize: int) -> None:
        consumer: Any = app.consumer
        feeds = getattr(consumer, "_fw_feeds", None)
        if feeds is None:
            raise RuntimeError("direct_delivery(app) must be installed before a BatchFeed")
        self.app = app
        self.topic = topic
        self.queue: Any = app.FlowControlQueue(maxsize=maxsize, clear_on_resume=True)
        self._pressure: dict[Any, tuple[Any, Any]] = {}  # tp -> (full, drop) callbacks
        self.skipped = 0  # messages dropped: fetched for an older generation / while paused
        for name in topic.topics:
            feeds[name] = self

    def put(self, tp: Any, message: Any) -> None:
        """Queue a fetched message without waiting. Past the queue's high mark its partition
        leaves the fetcher's active set (what Faust's stream queues do: what was fetched is
        still taken) until the queue drops below its low mark."""
        pressure = self._pressure.get(tp)
        if pressure is None:
            consumer: Any = self.app.consumer
            tp = TP(tp.topic, tp.partition)  # Faust's own (the fetcher's is aiokafka's)

            def high() -> None:
                consumer.on_buffer_full(tp)

            def drop() -> None:
                consumer.on_buffer_drop(tp)

            pressure = self._pressure[tp] = (high, drop)
        self.queue.put_nowait_enhanced(message, on_pressure_high=pressure[0],
                                       on_pressure_drop=pressure[1])

    def subscribe(self) -> None:
        """Register the topic with Faust's conductor (what iterating a stream of it does):
        the consumer subscribes to it, tracks acks for it and assigns its partitions."""
        self.app.topics.add(self.topic.clone(is_iterator=True))

    async def batches(self, max_: int, within_s: float) -> AsyncIterator[list[Any]]:
        """Lists of at most `max_` messages: what is queued when the first one arrives, plus
        what arrives within `within_s` when that is fewer than `max_`. Messages fetched for
        an older consumer generation or while the flow is suspended are skipped, not acked
        (the seek to the committed offsets after the rebalance reads them again)."""
        q = self.queue
        app: Any = self.app
        while True:
            batch = [await q.get()]
            if q.qsize() + 1 < max_ and within_s > 0:
                await asyncio.sleep(within_s)
            take = min(max_ - 1, q.qsize())
            get = q.get_nowait
            batch.extend(get() for _ in range(take))
            gen = app.consumer_generation_id
            if not app.flow_control.is_active():
                self.skipped += len(batch)
                continue
            keep = [m for m in batch if m.generation_id == gen]
            self.skipped += len(batch) - len(keep)
            if keep:
                yield keep

    def ack(self, messages: list[Any]) -> None:
        """Acknowledge processed messages: their offsets may be committed, and their
        partitions took events now (what Faust's stream would tell its monitor, whose
        `stream_inbound_time` Faust's consumer reads to report a stalled stream)."""
        ack = self.app.consumer.ack
        tps = set()
        for m in messages:
            ack(m)
            tps.add(m.tp)
        monitor = getattr(self.app, "monitor", None)
        inbound = getattr(monitor, "stream_inbound_time", None)
        if isinstance(inbound, dict):
            now = time.monotonic()
            for tp in tps:
                inbound[TP(tp.topic, tp.partition)] = now


class SlowProcessingLine(logging.Filter):
    """Faust's consumer reports a partition whose stream has not started, has stopped, or
    has not committed as one ERROR of several paragraphs (the message, then "There are
    multiple possible explanations for this: 1) ... 2) ..."). It becomes one event line,
    `faust_slow_processing` with the message's first line and the setting it names, so the
    worker's log stays one event per line."""

    def filter(self, record: logging.LogRecord) -> bool:
        try:
            text = record.getMessage()
        except Exception:  # noqa: BLE001 - a broken record is not ours to judge
            return True
        if "There are multiple possible explanations" not in text:
            return True
        first = text.strip().split("\n", 1)[0].strip()
        setting = re.search(r"defined by the (\w+) setting,\s+currently set to (\S+?)\.?\s",
                            text)
        log_event("faust_slow_processing", logger=record.name, message=first,
                  setting=setting.group(1) if setting else None,
                  setting_value=setting.group(2) if setting else None)
        return False


def one_line_slow_processing() -> SlowProcessingLine:
    """Put SlowProcessingLine on the logger of Faust's aiokafka driver (once)."""
    lg = logging.getLogger(faust_aiokafka_logger())
    for f in lg.filters:
        if isinstance(f, SlowProcessingLine):
            return f
    f = SlowProcessingLine()
    lg.addFilter(f)
    return f


def faust_aiokafka_logger() -> str:
    """The name of the logger Faust's aiokafka driver (its consumer thread) writes to."""
    from faust.transport.drivers import aiokafka as driver

    return str(driver.logger.name)


def _can_deliver_now(app: Any, consumer: Any, tp: Any) -> bool:
    conductor = app.topics
    if consumer.suspend_flow.is_set() or app.flow_control._suspend.is_set():  # noqa: SLF001
        return False
    if conductor._tp_to_callback_lock.locked():  # noqa: SLF001
        return False
    buffer = app.producer.buffer
    if buffer.size > buffer.max_messages:
        return False
    return not any(chan.queue.full() for chan in conductor._tp_index.get(tp, ()))  # noqa: SLF001


async def _drain_messages(self: Any, fetcher: Any) -> None:
    """Consumer._drain_messages with the direct delivery of `direct_delivery`."""
    app = self.app
    callback = self.callback
    consumer_stopped = self._stopped.is_set
    fetcher_stopped = fetcher._stopped.is_set  # noqa: SLF001
    read_offset = self._read_offset
    acks_enabled_for = app.topics.acks_enabled_for
    commit_every = self._commit_every
    feeds = self._fw_feeds
    flow_suspended = app.flow_control._suspend.is_set  # noqa: SLF001
    fetch_suspended = self.suspend_flow.is_set
    flag = CONSUMER_FETCHING
    since_yield = 0
    try:
        while not (consumer_stopped() or fetcher_stopped()):
            self.diag.set_flag(flag)
            fetched = self.getmany(timeout=1.0)
            await self.sleep(0)
            if not self.should_stop:
                async for tp, message in fetched:
                    since_yield += 1
                    if since_yield > 100:  # other tasks get the loop between messages
                        await asyncio.sleep(0)
                        since_yield = 0
                    offset = message.offset
                    last = read_offset[tp]
                    if last is not None and offset < last:
                        continue  # read already (Faust logs these at dev level only)
                    if last and offset - last > 1 and acks_enabled_for(message.topic):
                        await self._add_gap(tp, last + 1, offset)
                    if commit_every is not None and self._n_acked >= commit_every:
                        self._n_acked = 0
                        await self.commit()
                    feed = feeds.get(tp.topic)
                    if feed is not None:  # a batch consumer's topic: queued as it is
                        if flow_suspended() or fetch_suspended():
                            await self.wait_first(feed.queue.put(message),
                                                  self.suspend_flow.wait())
                        else:
                            feed.put(tp, message)
                    elif _can_deliver_now(app, self, tp):
                        await callback(message)
                    else:
                        await self.wait_first(callback(message), self.suspend_flow.wait())
                    read_offset[tp] = offset
            self.diag.unset_flag(flag)
    except self.consumer_stopped_errors:
        if self.transport.app.should_stop:
            self.log.info("Broker stopped consumer, shutting down...")
            return
        raise
    except asyncio.CancelledError:
        if self.transport.app.should_stop:
            self.log.info("Consumer shutting down for user cancel.")
            return
        raise
    except Exception as exc:
        self.log.exception("Drain messages raised: %r", exc)
        raise
    finally:
        self.diag.unset_flag(flag)


def raw_producer(app: faust.App) -> Any:
    """The aiokafka producer under Faust's (started with the app)."""
    return app.producer._ensure_producer()  # type: ignore[attr-defined]  # noqa: SLF001


class PartitionBatches:
    """Records to one topic as one produce batch per partition (aiokafka's create_batch /
    send_batch), partitioned by key with the producer's own partitioner, as a keyed send
    would be (Kafka's murmur2 by default). Faust's Topic.send per record (a Faust message, a
    future and callbacks each) was ~12 % of a fleet worker's CPU."""

    def __init__(self, app: faust.App, topic: str) -> None:
        self.app = app
        self.topic = topic

    async def sends(self, records: list[tuple[bytes, bytes]]
                    ) -> list[Callable[[], Awaitable[Any]]]:
        """One send per partition the records go to; each, when called, starts the
        partition's records in order (in several batches when one would be too big) and
        returns one awaitable for their delivery. A send called again starts them afresh.
        Record sizes are not checked here: the matcher stage bounds its records."""
        if not records:
            return []
        producer = raw_producer(self.app)
        parts = list(await producer.partitions_for(self.topic))
        partitioner = producer._partitioner  # noqa: SLF001 - the one a keyed send uses
        by_part: dict[int, list[tuple[bytes, bytes]]] = {}
        for key, value in records:
            by_part.setdefault(partitioner(key, parts, parts), []).append((key, value))
        return [self._send(producer, p, recs) for p, recs in by_part.items()]

    def _send(self, producer: Any, partition: int, recs: list[tuple[bytes, bytes]]
              ) -> Callable[[], Awaitable[Any]]:
        topic = self.topic

        async def send() -> Any:
            futs = []
            batch = producer.create_batch()
            for key, value in recs:  # (an empty batch takes any record: sizes are the
                if batch.append(key=key, value=value, timestamp=None) is None:  # stage's)
                    futs.append(await producer.send_batch(batch, topic, partition=partition))
                    batch = producer.create_batch()
                    batch.append(key=key, value=value, timestamp=None)
            futs.append(await producer.send_batch(batch, topic, partition=partition))
            return asyncio.gather(*futs)
        return send
