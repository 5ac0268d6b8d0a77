"""The one decision intake of the consumers that act on decisions (the agent's follower,
`actuate`, `notify`): the signature gate, one decode, the replay rule, each refusal logged
under one event name (`decision_refused`, `undecodable_decision`)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from faultwatch.core.events import Decision
from faultwatch.errors import DecodeError
from faultwatch.trust.records import DecisionGate
from faultwatch.trust.replay import ReplayGuard
from faultwatch.wire.decisions import decode_decision

Log = Callable[..., None]


def where_of(topic: str | None, partition: int | None, offset: int | None) -> str:
    """`topic[partition]@offset`: what the replay rule remembers a record by."""
    return f"{topic}[{partition}]@{offset}" if topic is not None else ""


class DecisionIntake:
    """`decode(value, ...)`: the gate, then the decoder (a record that does not decode is
    counted and logged, never raised: one bad record never blinds a consumer);
    `fresh(decision, now, ...)`: the replay rule (too old, from the future, seen before)."""

    def __init__(self, gate: DecisionGate, replay: ReplayGuard, log: Log) -> None:
        self.gate, self.replay, self._log = gate, replay, log
        self.bad = 0  # records that did not decode

    def decode(self, value: bytes | None, *, topic: str | None = None,
               partition: int | None = None, offset: int | None = None) -> Decision | None:
        if not self.gate.admit_record(value, topic=topic, partition=partition, offset=offset):
            return None  # unsigned or forged while a key is configured: logged by the gate
        try:
            return decode_decision(value)
        except DecodeError as e:
            self.undecodable(str(e), topic=topic, partition=partition, offset=offset)
        except Exception as e:  # noqa: BLE001 - one bad record never blinds the consumer
            self.undecodable(repr(e), topic=topic, partition=partition, offset=offset)
        return None

    def undecodable(self, error: str, **where: Any) -> None:
        self.bad += 1
        self._log("undecodable_decision", **where, error=error[:300])

    def fresh(self, dec: Decision, now: float, **where: Any) -> bool:
        """Whether the replay rule lets `dec` act now (`where`: topic, partition, offset of
        the record, or any fields the refusal's event line should carry)."""
        at = where_of(where.get("topic"), where.get("partition"), where.get("offset"))
        return fresh(self.replay, dec, now, self._log, at, **where)


    def take(self, value: bytes | None, now: float, *, topic: str | None = None,
             partition: int | None = None, offset: int | None = None) -> Decision | None:
        """decode() then fresh(): the decision to act on, or None (refused, logged)."""
        dec = self.decode(value, topic=topic, partition=partition, offset=offset)
        if dec is None or not self.fresh(dec, now, topic=topic, partition=partition,
                                         offset=offset):
            return None
        return dec


def fresh(replay: ReplayGuard, dec: Decision, now: float, log: Log, at: str = "",
          **fields: Any) -> bool:
    """The replay rule for one decision read at `at` (topic[partition]@offset): True when
    it may act now, else False with `decision_refused` logged (reason, id, job, action, age)."""
    why = replay.check(dec.id, dec.ts, now, at)
    if why is None:
        return True
    log("decision_refused", reason=why, id=dec.id, job=dec.job, action=dec.action,
        age_s=round(now - dec.ts, 1), max_age_s=replay.max_age_s, **fields)
    return False
