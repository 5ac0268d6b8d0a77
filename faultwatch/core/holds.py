"""Operator holds and mutes of one job (pure, time passed in), like `scontrol hold` and
`amtool silence add`: who set it, why, until when.

- a **hold** ("don't restart job X, I am debugging it"): the job stage publishes the job's
  restart, blacklist and fail decisions as `notify` notices (`evidence.held` says who held it
  and what would have been done) and acts on none of them: no restart budget is spent, no
  node is quarantined, the agents leave the processes as they are (a hung rank stays for
  py-spy). The attempt counts as decided; the job's next attempt is watched as usual (and
  held too while the hold lasts).
- a **mute**: whatever is decided is acted on as usual, but `faultwatch notify` posts nothing
  about the job (its intake asks `muted`).

A hold ends at `until` or when released (a later record with `released`). Bounded: one job
per record (no patterns), at most MAX_HOLD_S, a reason of at most MAX_REASON_CHARS.
"""

from __future__ import annotations

import dataclasses
import hashlib
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from faultwatch.core.events import Decision
from faultwatch.core.state import JobState

HOLD, MUTE = "hold", "mute"
KINDS = (HOLD, MUTE)
MAX_HOLD_S = 7 * 86400.0  # renew a longer one before it ends (like the quarantine cap)
MAX_REASON_CHARS = 500
MAX_BY_CHARS = 200
HELD_ACTIONS = frozenset({"restart", "blacklist", "fail"})


@dataclass(frozen=True)
class Hold:
    """One operator hold or mute of a job (the latest record for its kind and job)."""

    kind: str  # HOLD or MUTE
    job: str
    at: float  # when it was set (or released)
    until: float  # when it ends
    reason: str = ""
    by: str = ""  # user@host of the operator (a name for people; the signature is the proof)
    id: str = ""
    released: bool = False
    # one more than the record of its kind and job it was built on (trust/versions.py): a
    # follower orders records by (seq, at), so an old record written again is refused
    # whatever the clocks say
    seq: int = 0

    def in_force(self, now: float) -> bool:
        return not self.released and now < self.until

    def to_dict(self) -> dict[str, Any]:
        return {"kind": self.kind, "job": self.job, "at": self.at, "until": self.until,
                "reason": self.reason, "by": self.by, "id": self.id,
                "released": self.released, "seq": self.seq}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> Hold:
        return cls(kind=str(d["kind"]), job=str(d["job"]), at=float(d["at"]),
                   until=float(d["until"]), reason=str(d.get("reason", "")),
                   by=str(d.get("by", "")), id=str(d.get("id", "")),
                   released=bool(d.get("released", False)), seq=int(d.get("seq", 0)))

    @property
    def version(self) -> tuple[int, float]:
        """What orders two records of one kind and job (trust/versions.py)."""
        return (self.seq, self.at)

    def describe(self, now: float) -> str:
        """`held by alice@ops-1 for 1h59m more (until 14:05:00Z): debugging`."""
        if self.released:
            return f"{self.kind} released by {self.by} at {_clock(self.at)}"
        if not self.in_force(now):
            return f"{self.kind} by {self.by} ended at {_clock(self.until)}"
        verb = "held" if self.kind == HOLD else "muted"
        return (f"{verb} by {self.by} for {duration_text(self.until - now)} more (until "
                f"{_clock(self.until)}): {self.reason}")


def _clock(ts: float) -> str:
    return datetime.fromtimestamp(ts, tz=UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def duration_text(s: float) -> str:
    """3725 -> `1h2m`, 90 -> `1m30s`, 5 -> `5s`."""
    s = max(0, int(s))
    d, rest = divmod(s, 86400)
    h, rest = divmod(rest, 3600)
    m, sec = divmod(rest, 60)
    parts = [f"{d}d" if d else "", f"{h}h" if h else "", f"{m}m" if m and not d else "",
             f"{sec}s" if sec and not (d or h) else ""]
    return "".join(parts) or "0s"


def new_hold(kind: str, job: str, now: float, duration_s: float, reason: str, by: str,
             hold_id: str, last: Hold | None = None) -> Hold:
    """A hold or mute from now for `duration_s` (ValueError beyond the bounds)."""
    if kind not in KINDS:
        raise ValueError(f"kind must be one of {KINDS}, not {kind!r}")
    if not 0 < duration_s <= MAX_HOLD_S:
        raise ValueError(f"a {kind} lasts more than 0 s and at most {MAX_HOLD_S / 86400:g} "
                         f"days (renew it before it ends), not {duration_s:g} s")
    if len(reason) > MAX_REASON_CHARS:
        raise ValueError(f"the reason is {len(reason)} characters (at most "
                         f"{MAX_REASON_CHARS})")
    return Hold(kind, job, now, now + duration_s, reason, by[:MAX_BY_CHARS], hold_id,
                seq=0 if last is None else last.seq + 1)


def released(h: Hold, now: float, by: str, reason: str = "") -> Hold:
    """The record that ends `h` now (built on it: one more `seq`)."""
    return dataclasses.replace(h, at=now, until=min(h.until, now), released=True,
                               by=by[:MAX_BY_CHARS], reason=reason[:MAX_REASON_CHARS],
                               seq=h.seq + 1)


def held_id(dec: Decision) -> str:
    """The id of a held decision's notice: not the decision's own (an agent that saw the
    notice must still act on the real decision if a replayed batch publishes it later)."""
    return hashlib.sha256(f"held\x1f{dec.id}".encode()).hexdigest()[:20]


def hold_decisions(prev: JobState, st: JobState, decs: list[Decision], hold: Hold | None,
                   now: float) -> tuple[JobState, list[Decision]]:
    """What a job stage publishes and keeps for a job under `hold`: its restart, blacklist
    and fail decisions become `notify` notices (evidence.held), and the state keeps what
    `prev` had spent (restarts, their times, blacklist terms, failed, hot spares taken).
    Anything else, or no hold in force: unchanged."""
    if hold is None or hold.kind != HOLD or not hold.in_force(now) \
            or not any(d.action in HELD_ACTIONS for d in decs):
        return st, decs
    out = []
    for d in decs:
        if d.action not in HELD_ACTIONS:
            out.append(d)
            continue
        held = {"by": hold.by, "reason": hold.reason, "until": hold.until, "id": hold.id,
                "action": d.action, "decision": d.id}
        if d.swaps:  # a notice swaps no spare in (it says which it would have)
            held["swaps"] = [{"node": a, "spare": b} for a, b in d.swaps]
        out.append(dataclasses.replace(
            d, id=held_id(d), action="notify", swaps=(),
            message=f"held by {hold.by} ({hold.reason}); would {d.action}: {d.message}",
            evidence={**d.evidence, "held": held}))
    st = dataclasses.replace(st, restarts_used=prev.restarts_used,
                             restart_times=prev.restart_times, blacklist=prev.blacklist,
                             failed=prev.failed, spares=prev.spares)
    return st, out
