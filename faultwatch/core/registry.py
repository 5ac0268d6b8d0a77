"""The fleet-wide node registry: healthy / suspect / quarantined nodes, pure and time-passed-in.

One `NodeRecord` per node is the value of the compacted `<prefix>nodes` topic (key = node).
A quarantine lasts `quarantine_s * 2**(strikes-1)` (capped at `max_quarantine_s`); when it
expires the node is on probation (state `suspect`) for `probation_s`, and a new quarantine
during probation doubles again. Strikes are never forgotten by expiry, only by a release
with `forget=True`. Every change appends a `Reason` to a bounded history and bumps `seq`,
the record's version: a follower orders a node's records by (seq, updated_ts), so an old
record written again is refused whatever the clocks say (trust/versions.py).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

from faultwatch.core.policy import DEFAULTS

HEALTHY, SUSPECT, QUARANTINED = "healthy", "suspect", "quarantined"
MAX_QUARANTINE_S = 7 * 24 * 3600.0  # the longest quarantine or blacklisting, however often
STATES = (HEALTHY, SUSPECT, QUARANTINED)
MAX_REASONS = 16
MAX_LINE_CHARS = 1024


@dataclass(frozen=True, slots=True)
class RegistryPolicy:
    """How long quarantines and probations last (seconds)."""

    quarantine_s: float = DEFAULTS["blacklist_s"]  # the policy's first blacklist
    max_quarantine_s: float = MAX_QUARANTINE_S
    probation_s: float = 3600.0


@dataclass(frozen=True, slots=True)
class Reason:
    """Why a node's state changed: the decision (or manual action) behind it."""

    ts: float
    event: str  # quarantine | suspect | release | expire | probation-over
    decision: str = ""
    rule: str | None = None
    line: str | None = None
    job: str = ""

    def to_dict(self) -> dict[str, Any]:
        return {"ts": self.ts, "event": self.event, "decision": self.decision,
                "rule": self.rule, "line": self.line, "job": self.job}


@dataclass(frozen=True, slots=True)
class NodeRecord:
    """One node's registry entry (the value of its key on the nodes topic)."""

    node: str
    state: str = HEALTHY
    until: float | None = None  # quarantine end, or probation end while suspect after expiry
    strikes: int = 0  # quarantines so far: the backoff exponent
    reasons: tuple[Reason, ...] = field(default_factory=tuple)
    updated_ts: float = 0.0
    probation: bool = False  # suspect because a quarantine expired (until = probation end)
    seq: int = 0  # the record's version: each change derived from the record before is +1

    def to_dict(self) -> dict[str, Any]:
        return {"node": self.node, "state": self.state, "until": self.until,
                "strikes": self.strikes, "reasons": [r.to_dict() for r in self.reasons],
                "updated_ts": self.updated_ts, "probation": self.probation, "seq": self.seq}

    @property
    def version(self) -> tuple[int, float]:
        """What orders two records of one node: the newer has the greater version."""
        return (self.seq, self.updated_ts)

    def decisions(self) -> set[str]:
        return {r.decision for r in self.reasons if r.decision}


Registry = dict[str, NodeRecord]


def _with_reason(rec: NodeRecord, reason: Reason, **changes: Any) -> NodeRecord:
    line = reason.line[:MAX_LINE_CHARS] if reason.line else reason.line
    reason = dataclasses.replace(reason, line=line)
    return dataclasses.replace(rec, reasons=(rec.reasons + (reason,))[-MAX_REASONS:],
                               updated_ts=reason.ts, seq=rec.seq + 1, **changes)


def backoff_s(first_s: float, strikes: int, cap_s: float = MAX_QUARANTINE_S) -> float:
    """The one quarantine backoff: the n-th quarantine or blacklisting of a node (strikes
    >= 1) lasts first_s doubled n-1 times, capped (the registry's and the job stage's)."""
    exp = min(max(strikes - 1, 0), 60)
    return min(first_s * 2.0 ** exp, cap_s)


def quarantine_duration_s(strikes: int, policy: RegistryPolicy) -> float:
    """The n-th quarantine (strikes >= 1) lasts quarantine_s doubled n-1 times, capped."""
    return backoff_s(policy.quarantine_s, strikes, policy.max_quarantine_s)


def expire(rec: NodeRecord, now: float, policy: RegistryPolicy) -> NodeRecord:
    """Apply time: quarantine past `until` -> suspect on probation; probation past its end ->
    healthy. Idempotent; returns `rec` unchanged when nothing is due."""
    if rec.state == QUARANTINED and rec.until is not None and now >= rec.until:
        end = rec.until + policy.probation_s
        rec = _with_reason(rec, Reason(ts=rec.until, event="expire",
                                       line=f"quarantine over; probation until {end:.0f}"),
                           state=SUSPECT, until=end, probation=True)
    if rec.state == SUSPECT and rec.probation and rec.until is not None and now >= rec.until:
        rec = _with_reason(rec, Reason(ts=rec.until, event="probation-over"),
                           state=HEALTHY, until=None, probation=False)
    return rec


def quarantine(rec: NodeRecord | None, node: str, now: float, reason: Reason,
               policy: RegistryPolicy, duration_s: float | None = None) -> NodeRecord:
    """Quarantine a node: one more strike; the duration doubles per strike unless given.
    A node already quarantined keeps the later of both ends and gains no strike."""
    cur = expire(rec or NodeRecord(node=node), now, policy)
    if cur.state == QUARANTINED:
        end = now + duration_s if duration_s is not None else cur.until
        until = max(x for x in (cur.until, end) if x is not None) if end is not None \
            else cur.until
        return _with_reason(cur, dataclasses.replace(reason, event="quarantine"), until=until)
    strikes = cur.strikes + 1
    dur = duration_s if duration_s is not None else quarantine_duration_s(strikes, policy)
    return _with_reason(cur, dataclasses.replace(reason, event="quarantine"),
                        state=QUARANTINED, until=now + dur, strikes=strikes, probation=False)


def suspect(rec: NodeRecord | None, node: str, now: float, reason: Reason,
            policy: RegistryPolicy) -> NodeRecord:
    """Mark a node suspect (a blacklist candidate): no strike; a quarantined node stays so."""
    cur = expire(rec or NodeRecord(node=node), now, policy)
    if cur.state == QUARANTINED:
        return _with_reason(cur, dataclasses.replace(reason, event="suspect"))
    return _with_reason(cur, dataclasses.replace(reason, event="suspect"), state=SUSPECT,
                        until=cur.until if cur.probation else None)


def release(rec: NodeRecord | None, node: str, now: float, reason: Reason,
            forget: bool = False) -> NodeRecord:
    """Back to healthy now (a person's call); `forget` also clears the strikes."""
    cur = rec or NodeRecord(node=node)
    return _with_reason(cur, dataclasses.replace(reason, event="release"), state=HEALTHY,
                        until=None, probation=False, strikes=0 if forget else cur.strikes)


def registry_updates(decision: Any, registry: Registry, now: float,
                     policy: RegistryPolicy | None = None) -> list[NodeRecord]:
    """The registry records a decision changes: a `blacklist` quarantines its target nodes,
    `blacklist_candidates` in its evidence (or the `node` of a decision whose evidence says
    `blacklist_candidate: true`: failed boot checks, a node slow twice) become suspects.
    Replaying the same decision changes nothing (its id is already in the node's reasons).
    `decision` is a `core.events.Decision` (duck-typed: id, job, action, nodes, rule,
    evidence, message)."""
    pol = policy or RegistryPolicy()
    evidence = decision.evidence if isinstance(decision.evidence, dict) else {}
    line = _evidence_line(evidence) or (getattr(decision, "message", "") or None)
    out: list[NodeRecord] = []
    touched: set[str] = set()
    if decision.action == "blacklist":
        for node in decision.nodes:
            rec = registry.get(node)
            if rec is not None and decision.id in rec.decisions():
                continue
            new = quarantine(rec, node, now, Reason(ts=now, event="quarantine",
                                                    decision=decision.id, rule=decision.rule,
                                                    line=line, job=decision.job), pol)
            out.append(new)
            touched.add(node)
    cands = evidence.get("blacklist_candidates")
    cands = list(cands) if isinstance(cands, list) else []
    if evidence.get("blacklist_candidate") is True and isinstance(evidence.get("node"), str):
        cands.append(evidence["node"])  # a notify naming one node (failed checks, slow twice)
    if cands:
        for node in dict.fromkeys(cands):
            if not isinstance(node, str) or node in touched:
                continue
            rec = registry.get(node)
            if rec is not None and decision.id in rec.decisions():
                continue
            out.append(suspect(rec, node, now, Reason(ts=now, event="suspect",
                                                      decision=decision.id,
                                                      rule=decision.rule, line=line,
                                                      job=decision.job), pol))
    return out


def _evidence_line(evidence: dict[str, Any]) -> str | None:
    fe = evidence.get("first_error")
    if isinstance(fe, dict) and isinstance(fe.get("line"), str):
        return str(fe["line"])
    return None
