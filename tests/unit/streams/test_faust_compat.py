"""Fails loudly when faust-streaming or aiokafka change the private API our adapter uses."""

from __future__ import annotations

import contextvars
import inspect
from typing import Any

import aiokafka
import faust
import faust.streams
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


def test_the_fetcher_waits_on_each_callback_and_the_suspended_flow() -> None:
    # what inline_message_callbacks intercepts; if Faust changes this call, revisit it
    src = inspect.getsource(faust.transport.consumer.Consumer._drain_messages)
    assert "await self.wait_first(\n" in src
    assert "callback(message), self.suspend_flow.wait()" in src


def _inlined_app(name: str) -> faust.App:
    app = faust.App(name, broker="kafka://127.0.0.1:1")
    faust_compat.inline_message_callbacks(app)
    return app


def test_a_callback_that_does_not_wait_runs_inline_without_tasks() -> None:
    import asyncio

    created: list[object] = []

    async def callback(n: int) -> int:
        return n * 2

    async def main() -> Any:
        consumer: Any = _inlined_app("compat-inline-1").consumer
        loop = asyncio.get_running_loop()

        def factory(lp: asyncio.AbstractEventLoop, coro: Any, **kw: Any) -> asyncio.Task[Any]:
            created.append(coro)
            return asyncio.Task(coro, loop=lp, **kw)

        loop.set_task_factory(factory)  # type: ignore[arg-type]
        res = await consumer.wait_first(callback(21), consumer.suspend_flow.wait())
        loop.set_task_factory(None)
        return res

    res = asyncio.run(main())
    assert (res.results, res.stopped) == ([42], False)
    assert created == []  # Faust's wait_first would have started four tasks


def test_a_waiting_callback_finishes_or_is_interrupted_by_a_suspended_flow() -> None:
    import asyncio

    cancelled: list[bool] = []

    async def callback(fut: asyncio.Future[int]) -> int:
        try:
            return await fut + 1
        except asyncio.CancelledError:
            cancelled.append(True)
            raise

    async def main() -> tuple[Any, Any]:
        consumer: Any = _inlined_app("compat-inline-2").consumer  # its events on this loop
        loop = asyncio.get_running_loop()
        done: asyncio.Future[int] = loop.create_future()
        loop.call_later(0.05, done.set_result, 41)
        finished = await consumer.wait_first(callback(done), consumer.suspend_flow.wait())
        stuck: asyncio.Future[int] = loop.create_future()
        loop.call_later(0.05, consumer.suspend_flow.set)
        interrupted = await asyncio.wait_for(
            consumer.wait_first(callback(stuck), consumer.suspend_flow.wait()), 5)
        await asyncio.sleep(0)
        return finished, interrupted

    finished, interrupted = asyncio.run(main())
    assert finished.results == [42]  # positive control: the waiting callback completes
    assert interrupted.results == [True]  # the suspended flow won (Event.wait() is True)
    assert cancelled == [True]  # and the blocked callback was cancelled, as in Faust


def test_a_callback_error_propagates() -> None:
    import asyncio

    import pytest

    async def callback() -> None:
        raise ValueError("bad message")

    async def main() -> None:
        consumer: Any = _inlined_app("compat-inline-3").consumer
        await consumer.wait_first(callback(), consumer.suspend_flow.wait())

    with pytest.raises(ValueError, match="bad message"):
        asyncio.run(main())


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
