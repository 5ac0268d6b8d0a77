"""Fails loudly when faust-streaming or aiokafka change the private API our adapter uses."""

from __future__ import annotations

import contextvars
import inspect

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
