"""Fails loudly when faust-streaming or aiokafka change the private API our adapter uses."""

from __future__ import annotations

import contextvars
import inspect

import aiokafka
import faust
import faust.streams
import pytest
from faust.transport.drivers import aiokafka as faust_aiokafka
from mode.threads import ServiceThread

from faultwatch.streams import faust_compat


def test_current_event_is_a_context_variable_holding_a_weak_reference() -> None:
    var = faust.streams._current_event  # noqa: SLF001
    assert isinstance(var, contextvars.ContextVar)

    class Ev:
        pass

    ev = Ev()
    ctx = contextvars.copy_context()
    ctx.run(faust_compat.set_current_event, ev)
    assert ctx.run(faust.streams.current_event) is ev


def test_the_consumer_thread_holds_the_aiokafka_consumer_and_its_loop() -> None:
    thread_cls = faust_aiokafka.AIOKafkaConsumerThread
    assert issubclass(thread_cls, ServiceThread)
    assert "_consumer" in inspect.getsource(thread_cls)
    assert "_thread" in faust_aiokafka.Consumer.__annotations__
    init = inspect.getsource(ServiceThread.__init__)
    assert "self.thread_loop" in init
    # closing the aiokafka consumer leaves the group (and commits nothing: no auto-commit)
    assert "_coordinator.close()" in inspect.getsource(aiokafka.AIOKafkaConsumer.stop)


def test_no_consumer_means_nothing_to_leave() -> None:
    app = faust.App("compat-test", broker="kafka://127.0.0.1:1")
    assert faust_compat.aiokafka_consumer(app) is None


def test_aiokafka_seeks_only_partitions_with_a_positive_committed_offset() -> None:
    # what reread_uncommitted_partitions works around; if aiokafka starts seeking
    # uncommitted partitions (or Faust stops calling seek_to_committed), revisit it
    src = inspect.getsource(aiokafka.AIOKafkaConsumer.seek_to_committed)
    assert "if offset and offset > 0:" in src
    assert "seek_to_committed()" in inspect.getsource(
        faust.transport.consumer.Consumer.perform_seek)


def test_uncommitted_partitions_of_our_topics_are_sought_to_the_beginning() -> None:
    import asyncio

    app = faust.App("compat-test-2", broker="kafka://127.0.0.1:1")
    calls: list[tuple[str, ...]] = []

    class TP(tuple):  # type: ignore[type-arg]
        @property
        def topic(self) -> str:
            return str(self[0])

    async def committed() -> dict[object, int | None]:
        return {TP(("logs", 0)): None, TP(("logs", 1)): 0, TP(("logs", 2)): 7,
                TP(("other", 0)): None}

    async def seek_to_beginning(*tps: TP) -> None:
        calls.append(tuple(f"{t[0]}/{t[1]}" for t in tps))

    app.consumer.seek_to_committed = committed  # type: ignore[method-assign]
    assert callable(faust_aiokafka.AIOKafkaConsumerThread.seek_to_beginning)
    app.consumer._thread.seek_to_beginning = seek_to_beginning  # type: ignore[attr-defined]
    faust_compat.reread_uncommitted_partitions(app, {"logs"})
    asyncio.run(app.consumer.seek_to_committed())
    assert calls == [("logs/0", "logs/1")]


def test_the_quiet_monitor_keeps_no_per_record_statistics_but_tracks_offsets() -> None:
    from faust.sensors.monitor import Monitor
    from faust.types import TP

    tp = TP("logs", 0)

    class Msg:
        time_in = None

    class Owner:
        pass

    class Stream:
        task_owner = Owner()

    def feed(mon: Monitor) -> None:
        msg, stream = Msg(), Stream()
        mon.on_message_in(tp, 5, msg)  # type: ignore[arg-type]
        state = mon.on_stream_event_in(tp, 5, stream, msg)  # type: ignore[arg-type]
        mon.on_stream_event_out(tp, 5, stream, msg, state)  # type: ignore[arg-type]
        mon.on_message_out(tp, 5, msg)  # type: ignore[arg-type]
        mon.track_tp_end_offset(tp, 9)

    faust_mon = Monitor()
    quiet = faust_compat.QuietMonitor()
    feed(faust_mon)
    feed(quiet)
    assert faust_mon.messages_received_total == 1  # positive control: Faust counts
    assert quiet.messages_received_total == 0 and quiet.events_total == 0
    assert quiet.tp_end_offsets[tp] == 9  # offsets are still tracked
    # a processor app uses it
    from faultwatch.streams import faust_app
    assert "monitor=QuietMonitor()" in inspect.getsource(faust_app.build_processor)


def test_a_resume_while_flowing_keeps_the_queued_records_a_resume_after_suspend_clears() -> None:
    app = faust.App(f"fc-{id(object())}", broker="kafka://127.0.0.1:1")
    fc = app.flow_control
    from mode.utils.queues import FlowControlQueue

    queue: FlowControlQueue = FlowControlQueue(maxsize=10, flow_control=fc, clear_on_resume=True)
    fc.manage_queue(queue)
    faust_compat.keep_queues_when_flowing(app)
    fc.resume()  # suspended at first: this resume clears, as Faust's does
    assert fc.is_active()
    queue.put_nowait("fetched from the committed offset")
    fc.resume()  # recovery's second resume while already flowing
    assert queue.qsize() == 1, "a resume while flowing dropped a fetched record"
    fc.suspend()  # a revocation
    fc.resume()
    assert queue.qsize() == 0, "what was fetched before a suspension must still be cleared"
    # positive control: Faust's own resume clears even while flowing (what we guard against)
    queue.put_nowait("x")
    type(fc).resume(fc)
    assert queue.qsize() == 0


def test_faust_delivers_each_fetched_message_through_wait_first() -> None:
    # what direct_delivery replaces: if Faust's fetch loop stops racing every delivery
    # against suspend_flow (or renames what our copy of the loop uses), revisit it
    src = inspect.getsource(faust.transport.consumer.Consumer._drain_messages)
    assert "callback(message), self.suspend_flow.wait()" in src
    for name in ("self._read_offset", "self._commit_every", "self._add_gap",
                 "self._n_acked", "acks_enabled_for", "CONSUMER_FETCHING"):
        assert name in src, name
    assert "await consumer._drain_messages(self)" in inspect.getsource(
        faust.transport.consumer.Fetcher)
    from faust.transport.producer import ProducerBuffer
    assert "self.size > self.max_messages" in inspect.getsource(ProducerBuffer.wait_until_ebb)
    assert "_tp_to_callback_lock" in inspect.getsource(
        faust.transport.conductor.Conductor._compile_message_handler)


def _drain(app: faust.App, batches: list[list[tuple[str, int, int]]],
           suspended: bool = False) -> tuple[list[tuple[int, int]], int]:
    """Run the patched fetch loop over `batches` of (topic, partition, offset): the offsets
    delivered and the number of wait_first calls."""
    import asyncio

    from faust.types import TP
    from mode.utils.locks import Event

    class Msg:
        def __init__(self, topic: str, partition: int, offset: int) -> None:
            self.topic, self.partition, self.offset = topic, partition, offset
            self.tp = TP(topic, partition)

    class Fetcher:
        _stopped = Event()

    consumer = app.consumer
    faust_compat.direct_delivery(app)
    got: list[tuple[int, int]] = []
    waits = [0]
    todo = list(batches)

    async def callback(message: Msg) -> None:
        got.append((message.partition, message.offset))

    async def getmany(timeout: float) -> object:
        if not todo:
            Fetcher._stopped.set()
            return
        for t, p, o in todo.pop(0):
            yield TP(t, p), Msg(t, p, o)

    async def wait_first(*coros: object, timeout: object = None) -> object:
        waits[0] += 1  # Faust's path (it races the delivery against the flow's suspension)
        return await coros[0]  # type: ignore[misc]

    async def main() -> None:
        consumer.callback = callback  # type: ignore[assignment]
        consumer.getmany = getmany  # type: ignore[assignment,method-assign]
        consumer.wait_first = wait_first  # type: ignore[method-assign]
        app.flow_control.resume()
        if suspended:
            consumer.suspend_flow.set()  # a rebalance began
        await asyncio.wait_for(consumer._drain_messages(Fetcher()), 10)  # noqa: SLF001

    asyncio.run(main())
    return got, waits[0]


def test_direct_delivery_awaits_each_message_in_order_without_tasks() -> None:
    app = faust.App(f"dd-{id(object())}", broker="kafka://127.0.0.1:1")
    batches = [[("logs", 0, 0), ("logs", 1, 5), ("logs", 0, 1)],
               [("logs", 0, 1), ("logs", 0, 2), ("logs", 1, 4), ("logs", 1, 6)]]
    got, waits = _drain(app, batches)
    # offsets below what was read are dropped (a refetch), the rest in fetch order
    assert got == [(0, 0), (1, 5), (0, 1), (0, 1), (0, 2), (1, 6)]
    assert waits == 0, "a delivery that cannot wait took Faust's four-task path"
    assert app.consumer._read_offset[faust.types.TP("logs", 1)] == 6  # noqa: SLF001


def test_a_suspended_flow_takes_fausts_own_path() -> None:
    # positive control of the test above: with the flow suspended (a rebalance), every
    # delivery races suspend_flow as in Faust
    app = faust.App(f"dd-{id(object())}", broker="kafka://127.0.0.1:1")
    got, waits = _drain(app, [[("logs", 0, 0), ("logs", 0, 1)]], suspended=True)
    assert waits == 2
    assert got == [(0, 0), (0, 1)]


class _Msg:
    """A fetched message as the patched fetch loop and BatchFeed read it."""

    def __init__(self, topic: str, partition: int, offset: int, generation_id: int = 0) -> None:
        from faust.types import TP

        self.topic, self.partition, self.offset = topic, partition, offset
        self.tp = TP(topic, partition)
        self.generation_id = generation_id
        self.acked = False


def _feed_app(maxsize: int = 100) -> tuple[faust.App, faust_compat.BatchFeed]:
    app = faust.App(f"feed-{id(object())}", broker="kafka://127.0.0.1:1")
    faust_compat.direct_delivery(app)
    return app, faust_compat.BatchFeed(app, app.topic("logs"), maxsize)


def test_a_feed_topic_is_queued_raw_and_other_topics_still_reach_the_conductor() -> None:
    import asyncio

    from faust.types import TP
    from mode.utils.locks import Event

    app, feed = _feed_app()
    consumer = app.consumer
    got: list[tuple[str, int]] = []
    waits = [0]

    class Fetcher:
        _stopped = Event()

    todo = [[("logs", 0, 0), ("other", 0, 0), ("logs", 1, 3), ("logs", 0, 1)]]

    async def callback(message: _Msg) -> None:
        got.append((message.topic, message.offset))

    async def getmany(timeout: float) -> object:
        if not todo:
            Fetcher._stopped.set()
            return
        for t, p, o in todo.pop(0):
            yield TP(t, p), _Msg(t, p, o)

    async def wait_first(*coros: object, timeout: object = None) -> object:
        waits[0] += 1
        return await coros[0]  # type: ignore[misc]

    async def main() -> list[list[tuple[int, int]]]:
        consumer.callback = callback  # type: ignore[assignment]
        consumer.getmany = getmany  # type: ignore[assignment,method-assign]
        consumer.wait_first = wait_first  # type: ignore[method-assign]
        app.flow_control.resume()
        await asyncio.wait_for(consumer._drain_messages(Fetcher()), 10)  # noqa: SLF001
        out = []
        async for batch in feed.batches(10, within_s=0.0):
            out.append([(m.partition, m.offset) for m in batch])
            break
        return out

    batches = asyncio.run(main())
    assert got == [("other", 0)], "only the non-feed topic goes through the conductor"
    assert batches == [[(0, 0), (1, 3), (0, 1)]], "the feed hands over one batch in fetch order"
    assert waits == [0], "a feed message took Faust's four-task path"
    assert consumer._read_offset[TP("logs", 1)] == 3  # noqa: SLF001


def test_feed_batches_are_bounded_and_skip_an_older_generation() -> None:
    import asyncio

    app, feed = _feed_app()

    async def main() -> list[list[int]]:
        app.flow_control.resume()
        app.consumer_generation_id = 2
        for o in range(5):
            feed.queue.put_nowait(_Msg("logs", 0, o, generation_id=1 if o == 1 else 2))
        out = []
        async for batch in feed.batches(2, within_s=0.0):
            out.append([m.offset for m in batch])
            if feed.queue.empty():
                break
        return out

    # at most 2 a batch; offset 1 was fetched before the rebalance: skipped (read again
    # after the seek to the committed offsets), never handed over
    assert asyncio.run(main()) == [[0], [2, 3], [4]]
    assert feed.skipped == 1


def test_feed_acks_make_offsets_committable_only_up_to_the_first_unacked() -> None:
    import asyncio

    from faust.types import TP

    app, feed = _feed_app()
    consumer = app.consumer
    app.topics._acking_topics.add("logs")  # noqa: SLF001 - as the conductor does on subscribe
    tp = TP("logs", 0)
    consumer._committed_offset[tp] = 0  # noqa: SLF001
    msgs = [_Msg("logs", 0, o) for o in range(4)]

    async def main() -> tuple[int | None, int | None]:
        feed.ack([msgs[0], msgs[1], msgs[3]])
        partial = consumer._new_offset(tp)  # noqa: SLF001
        feed.ack([msgs[2]])
        return partial, consumer._new_offset(tp)  # noqa: SLF001

    # a message left unacked holds the commit back (it is read again after a handover)
    assert asyncio.run(main()) == (2, 4)


def test_a_full_feed_takes_its_partition_out_of_fetching_until_it_drains() -> None:
    import asyncio

    from faust.types import TP

    app, feed = _feed_app(maxsize=10)
    consumer = app.consumer
    tp = TP("logs", 0)
    consumer._active_partitions = {tp}  # noqa: SLF001

    async def main() -> tuple[bool, bool]:
        app.flow_control.resume()
        for o in range(10):
            feed.put(tp, _Msg("logs", 0, o))
        paused = tp not in consumer._get_active_partitions()  # noqa: SLF001
        async for _ in feed.batches(100, within_s=0.0):
            break
        return paused, tp in consumer._get_active_partitions()  # noqa: SLF001

    paused, resumed = asyncio.run(main())
    assert paused and feed.queue.qsize() == 0
    assert resumed


def test_partition_batches_use_what_a_keyed_send_uses() -> None:
    # PartitionBatches: Faust's producer holds the aiokafka one; aiokafka partitions a keyed
    # send with its _partitioner over list(partitions of the topic); batches are public API
    assert "self._producer" in inspect.getsource(faust_aiokafka.Producer._ensure_producer)
    src = inspect.getsource(aiokafka.AIOKafkaProducer._partition)
    assert "list(self._metadata.partitions_for_topic(topic))" in src
    assert "self._partitioner(serialized_key, all_partitions, available)" in src
    for name in ("create_batch", "send_batch", "partitions_for"):
        assert callable(getattr(aiokafka.AIOKafkaProducer, name))


def test_a_failed_metadata_update_waits_the_retry_backoff() -> None:
    import asyncio
    import time

    from aiokafka.client import AIOKafkaClient
    from aiokafka.producer.sender import Sender

    # what the backoff is for: the sender waits on a forced update when a leader is unknown
    src = inspect.getsource(Sender._sender_routine)
    assert "unknown_leaders_exist" in src and "force_metadata_update()" in src
    assert "await self._metadata_update(" in inspect.getsource(AIOKafkaClient._md_synchronizer)

    async def three_updates() -> float:
        client = AIOKafkaClient(bootstrap_servers="127.0.0.1:1", retry_backoff_ms=150)
        t0 = time.monotonic()
        for _ in range(3):  # no broker known: each attempt fails at once
            assert await client._metadata_update(client.cluster, set()) is False  # noqa: SLF001
        return time.monotonic() - t0

    if not getattr(AIOKafkaClient, "_fw_metadata_backoff", False):
        assert asyncio.run(three_updates()) < 0.1  # positive control: aiokafka's own
    faust_compat.metadata_backoff()
    assert asyncio.run(three_updates()) >= 0.45


def test_partitions_the_feed_serves_count_as_streaming_for_fausts_stall_check() -> None:
    """Faust's consumer reports a partition whose monitor never saw a stream event as "Stream
    has not started processing" (several paragraphs at ERROR, issue 36 item 8); the feed and
    the quiet monitor tell it when a partition took events, as Faust's own streams do."""
    import asyncio

    from faust.types import TP

    src = inspect.getsource(faust_aiokafka.AIOKafkaConsumerThread.verify_event_path)
    assert "monitor.stream_inbound_time.get(tp)" in src  # what Faust reads
    app, feed = _feed_app()
    app.monitor = faust_compat.QuietMonitor()  # what the processor runs with
    app.topics._acking_topics.add("logs")  # noqa: SLF001 - as the conductor does on subscribe
    msgs = [_Msg("logs", 0, 0), _Msg("logs", 3, 0)]

    async def main() -> None:
        feed.ack(msgs)

    assert app.monitor.stream_inbound_time == {}
    asyncio.run(main())
    assert set(app.monitor.stream_inbound_time) == {TP("logs", 0), TP("logs", 3)}
    quiet = faust_compat.QuietMonitor()
    quiet.on_stream_event_in(TP("rules", 0), 1, None, None)  # type: ignore[arg-type]
    assert TP("rules", 0) in quiet.stream_inbound_time


def test_fausts_slow_processing_report_becomes_one_event_line(
        capsys: pytest.CaptureFixture[str]) -> None:
    import logging

    from faust.types import TP

    msg = faust_aiokafka.SLOW_PROCESSING_STREAM_IDLE_SINCE_START
    thread = faust_aiokafka.AIOKafkaConsumerThread.__new__(
        faust_aiokafka.AIOKafkaConsumerThread)
    text = thread._make_slow_processing_error(  # noqa: SLF001 - Faust's own message
        msg, [faust_aiokafka.SLOW_PROCESSING_CAUSE_STREAM], "stream_processing_timeout", 300.0)
    assert text.count("\n") > 5  # the several paragraphs Faust writes
    name = faust_compat.faust_aiokafka_logger()
    assert name == faust_aiokafka.logger.name
    record = logging.LogRecord(name, logging.ERROR, __file__, 1, text,
                               (TP("fw.logs", 3), "5.02 minutes ago"), None)
    line_filter = faust_compat.SlowProcessingLine()
    assert line_filter.filter(record) is False  # Faust's record is not written
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "event=faust_slow_processing" in err, err
    assert "Stream has not started processing TP(topic='fw.logs', partition=3)" in err
    assert "setting=stream_processing_timeout setting_value=300.0" in err
    other = logging.LogRecord(name, logging.ERROR, __file__, 1, "anything else", (), None)
    assert line_filter.filter(other) is True  # positive control: others pass
    assert faust_compat.one_line_slow_processing() in logging.getLogger(name).filters
