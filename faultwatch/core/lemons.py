"""Lemon nodes: a node blamed in incidents of at least k distinct jobs within a window, even
with no hardware rule match (Kokolis et al., HPCA 2025: nodes that fail many jobs without a
clean hardware error). Pure: incidents in, notices out, time passed in; bounded state.

Only incidents that speak about a node count: errors that are not the job's own (category
not `fatal`), hangs, lost nodes and exit hangs, each for the nodes its evidence blames (the
first error's node, the lost node, the hang's culprit), and only when it blames at most
MAX_BLAMED_NODES of them (a failure that blames a whole rack says nothing about one node).
Preemptions, operator stops and divergence are not the node's doing.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from faultwatch.core.blast import NOTICE_JOB
from faultwatch.core.decide import decision_id
from faultwatch.core.events import Decision

LEMON_KIND = "lemon-node"
COUNTED_CAUSES = ("error", "hang", "node-lost", "exit-hang")
MAX_BLAMED_NODES = 2  # an incident blaming more nodes counts for none of them
MAX_NODES = 100_000  # nodes tracked (least recently blamed dropped first)
MAX_PER_NODE = 64  # incidents remembered per node
MAX_NOTICES_PER_HOUR = 20  # lemon notices at most (more are counted, not sent)


@dataclass(frozen=True)
class Blame:
    """One incident's blame of one node (what the watch needs of an incident record)."""

    node: str
    job: str
    run_id: str
    incident: str
    cause: str
    ts: float
    rule: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return {"job": self.job, "run_id": self.run_id, "incident": self.incident,
                "cause": self.cause, "ts": self.ts, "rule": self.rule}


@dataclass(frozen=True)
class LemonNotice:
    """A node that failed `jobs` distinct jobs within the window, with the incidents."""

    node: str
    ts: float
    jobs: tuple[str, ...]
    evidence: tuple[Blame, ...]
    window_s: float
    min_jobs: int


def blames(job: str, run_id: str, incident: dict[str, Any]) -> list[Blame]:
    """The blames one incident record (ledger.Incident.to_dict()) makes."""
    cause = incident.get("cause")
    if cause not in COUNTED_CAUSES:
        return []
    if cause == "error" and incident.get("category") == "fatal":
        return []  # the job's own error (a bug, a bad config): not the node's
    nodes = [n for n in incident.get("nodes") or () if isinstance(n, str)]
    ts = incident.get("first_sign_ts")
    if not nodes or len(nodes) > MAX_BLAMED_NODES or not isinstance(ts, int | float):
        return []
    return [Blame(n, job, run_id, str(incident.get("id", "")), str(cause), float(ts),
                  incident.get("rule")) for n in nodes]


@dataclass
class LemonWatch:
    """Blames in (any order, duplicates ignored), notices out: a node gets one notice when
    its blames within `window_s` reach `min_jobs` distinct jobs, and another only after a
    window without one."""

    min_jobs: int = 3
    window_s: float = 7 * 86400.0
    nodes: OrderedDict[str, list[Blame]] = field(default_factory=OrderedDict)
    noticed: dict[str, float] = field(default_factory=dict)  # node -> last notice (event time)
    sent: list[float] = field(default_factory=list)  # notice times, the last hour
    suppressed: int = 0  # notices over MAX_NOTICES_PER_HOUR

    def observe(self, blames_in: Iterable[Blame], now: float, emit: bool = True
                ) -> list[LemonNotice]:
        """Fold blames in; the notices they trigger (none while `emit` is False: a follower
        catching up on the topic counts, and notices once it is live)."""
        out: list[LemonNotice] = []
        for b in blames_in:
            n = self._add(b, now, emit)
            if n is not None:
                out.append(n)
        return out

    def _add(self, b: Blame, now: float, emit: bool) -> LemonNotice | None:
        if b.ts < now - self.window_s:
            return None  # too old to count
        seen = self.nodes.pop(b.node, None) or []
        if any(x.incident == b.incident and x.job == b.job for x in seen):
            self.nodes[b.node] = seen
            return None
        seen = [x for x in seen if x.ts >= now - self.window_s] + [b]
        seen = sorted(seen, key=lambda x: x.ts)[-MAX_PER_NODE:]
        self.nodes[b.node] = seen  # the most recently blamed last
        while len(self.nodes) > MAX_NODES:
            old, _ = self.nodes.popitem(last=False)
            self.noticed.pop(old, None)
        jobs = tuple(dict.fromkeys(x.job for x in seen))
        last = self.noticed.get(b.node)
        if not emit or len(jobs) < self.min_jobs \
                or (last is not None and now - last < self.window_s):
            return None
        self.sent = [t for t in self.sent if t > now - 3600.0]
        if len(self.sent) >= MAX_NOTICES_PER_HOUR:
            self.suppressed += 1
            return None
        self.sent.append(now)
        self.noticed[b.node] = now
        return LemonNotice(b.node, now, jobs, tuple(seen), self.window_s, self.min_jobs)

    def lemons(self, now: float) -> list[str]:
        """Nodes whose blames within the window reach min_jobs distinct jobs, now."""
        out = []
        for node, seen in self.nodes.items():
            jobs = {x.job for x in seen if x.ts >= now - self.window_s}
            if len(jobs) >= self.min_jobs:
                out.append(node)
        return sorted(out)


def lemon_decision(n: LemonNotice, action: str, rules_version: str = "") -> Decision:
    """The notice as a decision of job "(fleet)", kind `lemon-node`: `notify`, or `blacklist`
    when the policy's lemon_action is `quarantine` (the registry quarantines the node and
    actuate drains it within its own limits). Its id is the node's and the incident that
    made it one: a second worker, or a replay, publishes the same id (consumers dedupe)."""
    last = n.evidence[-1]
    ev: dict[str, Any] = {"node": n.node, "jobs": list(n.jobs), "min_jobs": n.min_jobs,
                          "window_s": n.window_s,
                          "incidents": [b.to_dict() for b in n.evidence]}
    shown = ", ".join(n.jobs[:5]) + (f" and {len(n.jobs) - 5} more" if len(n.jobs) > 5 else "")
    msg = (f"{n.node} was blamed in incidents of {len(n.jobs)} distinct jobs within "
           f"{n.window_s / 3600:g}h ({shown}): a lemon node suspected"
           + ("; quarantined by the lemon policy" if action == "quarantine" else ""))
    return Decision(id=decision_id(NOTICE_JOB, 0, LEMON_KIND, f"{n.node}:{last.incident}"),
                    job=NOTICE_JOB, attempt=0,
                    action="blacklist" if action == "quarantine" else "notify",
                    kind=LEMON_KIND, ts=n.ts, nodes=(n.node,), rule=None, category="hardware",
                    message=msg, evidence=ev, rules_version=rules_version,
                    budgets={"restarts_used": 0, "max_restarts": 0})  # no job's budget
