"""The processor's start-up is calm: a fresh broker's missing group coordinator is normal
(INFO), a broker that does not answer is one state line, not an ERROR per retry."""

from __future__ import annotations

import logging

import pytest

from faultwatch.kafka import calm as broker_calm
from faultwatch.kafka.calm import BrokerLogGate


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


def test_an_overlapping_timer_on_a_busy_worker_is_not_an_unreachable_broker(
        monkeypatch: pytest.MonkeyPatch) -> None:
    gate = BrokerLogGate()
    now = [1000.0]
    monkeypatch.setattr(broker_calm.time, "time", lambda: now[0])
    slow = "Timer commit is overlapping (interval=1.0 runtime=1.34)"
    assert gate.filter(_record(slow, logging.WARNING))  # shown once
    assert gate.down_since is None
    now[0] += 1
    assert not gate.filter(_record(slow, logging.WARNING))  # then at most once per summary
    now[0] += broker_calm.SUMMARY_S
    assert gate.filter(_record(slow, logging.WARNING))
    assert gate.down_since is None
    # positive control: with the broker away it is one of the swallowed errors
    assert not gate.filter(_record("Unable connect to node with id 1: Connect call failed"))
    total = gate.total
    assert not gate.filter(_record(slow, logging.WARNING)) and gate.total == total + 1
