"""A job's timeline as `faultwatch logs` shows it (pure): shipped lines, boot checks, exits
and decisions as rows, each line once, and one separator row when an attempt starts, naming
the restart decision that caused it when that decision was read."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from faultwatch.core.events import Decision, RunStart

LINE, ATTEMPT, DECISION, EXIT, BOOTCHECK = "line", "attempt", "decision", "exit", "bootcheck"


@dataclass(frozen=True, slots=True)
class Row:
    """One thing `faultwatch logs` prints. `kind` is LINE (a shipped line: node, rank,
    stream, seq), ATTEMPT (an attempt starts; `decision` caused it if known), DECISION,
    EXIT (a node's command ended) or BOOTCHECK (a node's boot checks; `data` holds them)."""

    kind: str
    ts: float
    job: str
    run_id: str
    attempt: int
    text: str
    node: str | None = None
    rank: int | None = None
    stream: str | None = None
    seq: int | None = None
    flags: int = 0
    decision: Mapping[str, Any] | None = None
    data: Mapping[str, Any] | None = field(default=None, hash=False, compare=False)


def decision_brief(d: Decision) -> dict[str, Any]:
    """What a row says of a decision: id, action, kind, rule, targets, message."""
    return {"id": d.id, "action": d.action, "kind": d.kind, "rule": d.rule,
            "nodes": list(d.nodes), "ranks": list(d.ranks), "message": d.message}


def decision_row(d: Decision) -> Row:
    return Row(DECISION, d.ts, d.job, d.run_id, d.attempt, d.message, decision=decision_brief(d))


def start_row(ev: RunStart) -> Row:
    return Row(ATTEMPT, ev.ts, ev.job, ev.run_id, ev.attempt, "", node=ev.node)


class Timeline:
    """Turns read rows into printed rows: drops lines already seen (redelivered after an
    agent restart or a broker outage), keeps the first run start of each (run, attempt) as
    its separator and names the restart decision of the attempt before it."""

    def __init__(self) -> None:
        self.seen: set[tuple[str | None, str, int, str | None, int | None]] = set()
        self.started: set[tuple[str, int]] = set()
        self.decisions: set[str] = set()
        self.restarts: dict[tuple[str, int], Mapping[str, Any]] = {}

    def feed(self, row: Row) -> Row | None:
        """The row to print for `row`, or None (a duplicate, a later node's run start)."""
        if row.kind in (LINE, BOOTCHECK):
            key = (row.node, row.run_id, row.attempt, row.stream,
                   row.seq if row.kind == LINE else hash(row.ts))
            if key in self.seen:
                return None
            self.seen.add(key)
            return row
        if row.kind == DECISION:
            assert row.decision is not None
            did = str(row.decision["id"])
            if did in self.decisions:  # decisions are idempotent: each id once
                return None
            self.decisions.add(did)
            if row.decision["action"] == "restart":
                self.restarts[(row.run_id, row.attempt)] = row.decision
            return row
        if row.kind == ATTEMPT:
            key2 = (row.run_id, row.attempt)
            if key2 in self.started:
                return None
            self.started.add(key2)
            cause = self.restarts.get((row.run_id, row.attempt - 1))
            if cause is None and not row.run_id:
                cause = next((d for (_r, a), d in self.restarts.items() if a == row.attempt - 1),
                             None)
            return Row(ATTEMPT, row.ts, row.job, row.run_id, row.attempt, row.text,
                       node=row.node, decision=cause)
        return row

