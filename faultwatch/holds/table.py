"""The holds and mutes a follower (a processor worker, `faultwatch notify`) knows: the latest
record per kind and job, each admitted by the gate (an operator's signature when a trust file
is set) and not older by version (seq, at: trust/versions.py) than the one it replaces (an old
hold written again after its release is refused as `replayed`, whatever the clocks say).
Bounded: at most MAX_HOLDS records kept; at the cap the ended ones are dropped first, then new
jobs' records are refused (counted, one line)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from faultwatch.core.holds import HOLD, MUTE, Hold
from faultwatch.errors import DecodeError
from faultwatch.trust.replay import MAX_FUTURE_S, REPLAYED
from faultwatch.trust.versions import older
from faultwatch.wire.holds import decode_hold, hold_key

MAX_HOLDS = 10_000


class HoldsTable:
    """`observe(key, value, where)` folds one holds-topic record in; `hold_of(job, now)` and
    `muted(job, now)` answer the job stage and notify's intake."""

    def __init__(self, gate: Any = None, log: Callable[..., None] | None = None,
                 max_holds: int = MAX_HOLDS) -> None:
        self.gate = gate  # trust.records.RecordGate("hold", ...), or None: everything passes
        self._log = log or (lambda *_a, **_k: None)
        self.max_holds = max_holds
        self.holds: dict[tuple[str, str], Hold] = {}
        self.caught_up = False
        self.refused_full = 0

    def observe(self, key: bytes | None, value: bytes | None, where: str = "",
                now: float | None = None) -> Hold | None:
        """The hold now kept for this record's kind and job, or None when it was refused."""
        if value is None:  # a tombstone: no one can sign it
            if self.gate is not None and not self.gate.admit_value(None, at=where or None):
                return None
            kind, _, job = (key or b"").decode(errors="replace").partition("/")
            self.holds.pop((kind, job), None)
            return None
        try:
            hold, raw = decode_hold(value)
        except DecodeError as e:
            self._log("hold_undecodable", at=where or None, error=str(e)[:300])
            return None
        if key is not None and key != hold_key(hold.kind, hold.job):
            self._log("hold_undecodable", at=where or None,
                      error=f"key {key[:80]!r} does not name the record's {hold.kind} of "
                            f"{hold.job}")
            return None
        if self.gate is not None and not self.gate.admit(raw, at=where or None, job=hold.job):
            return None
        slot = (hold.kind, hold.job)
        held = self.holds.get(slot)
        if held is not None and older(held.version, hold.version):
            if self.gate is not None and self.gate.verifying:
                self.gate.refuse(REPLAYED, f"a {hold.kind} of {hold.job} of version "
                                 f"{hold.seq} set at {hold.at:.0f} after version {held.seq} "
                                 f"set at {held.at:.0f} (an old record written again)",
                                 at=where or None)
                return None
        if held is None and len(self.holds) >= self.max_holds:
            self._prune(hold.at if now is None else now)
            if len(self.holds) >= self.max_holds:
                self.refused_full += 1
                if self.refused_full in (1, 10, 100) or self.refused_full % 1000 == 0:
                    self._log("holds_full", kept=len(self.holds), refused=self.refused_full,
                              job=hold.job)
                return None
        self.holds[slot] = hold
        return hold

    def _prune(self, now: float) -> None:
        for slot in [s for s, h in self.holds.items()
                     if not h.in_force(now - MAX_FUTURE_S)]:
            del self.holds[slot]

    def get(self, kind: str, job: str, now: float) -> Hold | None:
        h = self.holds.get((kind, job))
        return h if h is not None and h.in_force(now) else None

    def hold_of(self, job: str, now: float) -> Hold | None:
        """The hold in force on `job` (the job stage asks)."""
        return self.get(HOLD, job, now)

    def muted(self, job: str, now: float) -> Hold | None:
        """The mute in force on `job` (notify's intake asks)."""
        return self.get(MUTE, job, now)

    def in_force(self, now: float) -> list[Hold]:
        return sorted((h for h in self.holds.values() if h.in_force(now)),
                      key=lambda h: (h.job, h.kind))
