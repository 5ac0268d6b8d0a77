"""The matcher and job stages without a broker: live rules, a dead-letter list, signals
records and ticks, for the stage tests."""

from __future__ import annotations

import functools
from typing import Any

import orjson

from faultwatch import wire
from faultwatch.core.policy import Policy
from faultwatch.rules import Matcher
from faultwatch.streams.records import InRecord, LiveRules
from tests.support.rules import builtin_ruleset

T0 = 1_700_000_000.0
POLICY = Policy(settle_s=0.5, node_lost_s=5.0)


@functools.cache
def ruleset() -> Any:
    return builtin_ruleset()


def live() -> LiveRules:
    rs = ruleset()
    return LiveRules(Matcher(rs), POLICY, rs.version)


class DeadLetters(list[tuple[InRecord, Exception]]):
    def __call__(self, rec: InRecord, err: Exception) -> None:
        self.append((rec, err))


def logs(i: int, value: bytes, key: bytes = b"k") -> InRecord:
    return InRecord("t.logs", 3, i, key, value)


def signals_of(values: list[tuple[bytes, bytes]]) -> list[Any]:
    out = []
    for _, v in values:
        out += wire.signals_of_record(wire.decode(v))
    return out


def tick_rec(partition: int, sent: float) -> InRecord:
    return InRecord("t.signals", partition, 0, None, orjson.dumps({"v": 1, "t": "tick",
                                                                    "now": sent}))
