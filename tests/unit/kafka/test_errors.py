"""Broker errors and aiokafka's noise, translated once (issue 36 item 8): the class name is
said once, and the cleartext-password warning is dropped where nothing leaves the host."""

from __future__ import annotations

import inspect
import logging

import aiokafka.conn
import pytest
from aiokafka import errors as ke

from faultwatch.kafka import clients
from faultwatch.kafka.errors import broker_error


@pytest.mark.parametrize(("exc", "tail"), [
    (ke.KafkaConnectionError("Unable to bootstrap from [('127.0.0.1', 1)]"),
     "[KafkaConnectionError: Unable to bootstrap from [('127.0.0.1', 1)]]"),
    (ke.KafkaConnectionError(), "[KafkaConnectionError]"),
    (ConnectionRefusedError(111, "Connection refused"),
     "[ConnectionRefusedError: [Errno 111] Connection refused]"),
    (TimeoutError(), "[TimeoutError]"),
])
def test_the_error_class_is_named_once(exc: BaseException, tail: str) -> None:
    text = str(broker_error(exc, "h:1", "reading x"))
    assert text.startswith("reading x at h:1: Kafka is unreachable") and text.endswith(tail)
    assert text.count(type(exc).__name__) == 1, text


class _Conn:
    """Stands where aiokafka's connection is when it warns: its handshake method's frame."""

    def __init__(self, host: str) -> None:
        self.host = host

    def _do_sasl_handshake(self) -> None:
        logging.getLogger("aiokafka.conn").warning(clients.CLEARTEXT)


def test_the_cleartext_warning_is_dropped_on_loopback_and_said_once_elsewhere(
        caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING, logger="aiokafka.conn"):
        for _ in range(8):  # the 8 connections of one `kafka up --secure`
            _Conn("127.0.0.1")._do_sasl_handshake()
        _Conn("localhost")._do_sasl_handshake()
        for _ in range(3):
            _Conn("kafka-1.example")._do_sasl_handshake()
        logging.getLogger("aiokafka.conn").warning(clients.CLEARTEXT)  # not from a handshake
    said = [r for r in caplog.records if r.getMessage() == clients.CLEARTEXT]
    assert len(said) == 2  # once for the remote host (the positive control), once unknown


def test_aiokafka_still_warns_from_the_handshake_the_filter_looks_for() -> None:
    """Fails when aiokafka moves the warning: the filter would stop seeing its host."""
    src = inspect.getsource(aiokafka.conn.AIOKafkaConnection._do_sasl_handshake)  # noqa: SLF001
    assert f'log.warning("{clients.CLEARTEXT}")' in src
    assert isinstance(inspect.getattr_static(aiokafka.conn.AIOKafkaConnection, "host"),
                      property)
    assert any(isinstance(f, clients.CleartextWarning)
               for f in logging.getLogger("aiokafka.conn").filters)
