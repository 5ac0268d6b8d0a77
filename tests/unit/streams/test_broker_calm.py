"""The processor's start-up is calm: a fresh broker's missing group coordinator is normal
(INFO), a broker that does not answer is one state line, not an ERROR per retry."""

from __future__ import annotations

import logging

import pytest

from faultwatch.streams import broker_calm
from faultwatch.streams.broker_calm import BrokerLogGate


def _record(msg: str, level: int = logging.ERROR) -> logging.LogRecord:
    return logging.LogRecord("aiokafka.consumer.group_coordinator", level, __file__, 1, msg,
                             None, None)


def test_no_coordinator_yet_is_info_then_its_own_level(monkeypatch: pytest.MonkeyPatch
                                                       ) -> None:
    gate = BrokerLogGate()
    now = [1000.0]
    monkeypatch.setattr(broker_calm.time, "time", lambda: now[0])
    r = _record("Group Coordinator Request failed: [Error 15] CoordinatorNotAvailableError")
    assert gate.filter(r) and r.levelno == logging.INFO and r.levelname == "INFO"
    assert gate.down_since is None  # the broker answered: not "unreachable"
    now[0] += broker_calm.COORDINATOR_GRACE_S + 1
    late = _record("Group Coordinator Request failed: [Error 15] CoordinatorNotAvailableError")
    assert gate.filter(late) and late.levelno == logging.ERROR  # it lasts: say so
    # positive control: a broker that does not answer is swallowed into broker_unreachable
    assert not gate.filter(_record("Unable connect to node with id 1: Connect call failed"))
    assert gate.down_since is not None
