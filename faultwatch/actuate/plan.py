"""What an actuator does about a decision or a node record: validated, deduplicable actions."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from faultwatch.core.blast import NOTICE_JOB
from faultwatch.core.events import Decision
from faultwatch.core.registry import HEALTHY, QUARANTINED, NodeRecord
from faultwatch.errors import ConfigError
from faultwatch.registry.names import (
    DECISION_ID_RE,
    K8S_NAME_RE,
    K8S_NAMESPACE_RE,
    RULE_ID_RE,
    SLURM_JOB_ID_RE,
    check,
    valid_job,
    valid_node,
)

QUARANTINE, RELEASE, REQUEUE = "quarantine", "release", "requeue"


@dataclass(frozen=True, slots=True)
class Action:
    """One thing to make the scheduler do; `key` is unique per intent (the dedupe key)."""

    kind: str  # quarantine | release | requeue
    node: str
    decision: str  # decision id (or manual-... / expire-...) behind it
    rule: str = ""
    job: str = ""  # faultwatch job name
    scheduler: dict[str, str] = field(default_factory=dict)  # validated identity fields
    ts: float = field(default=0.0, compare=False)  # when its cause happened (the decision's
    #                 time, the registry record's): a newer registry record overtakes it

    @property
    def key(self) -> str:
        return f"{self.kind}:{self.node}:{self.decision}"

    def to_dict(self) -> dict[str, Any]:
        return {"kind": self.kind, "node": self.node, "decision": self.decision,
                "rule": self.rule, "job": self.job, "scheduler": dict(self.scheduler),
                "ts": self.ts}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Action:
        return cls(kind=str(d["kind"]), node=str(d["node"]), decision=str(d["decision"]),
                   rule=str(d.get("rule", "")), job=str(d.get("job", "")),
                   scheduler={str(k): str(v) for k, v in dict(d.get("scheduler", {})).items()},
                   ts=float(d.get("ts", 0.0)))


def scheduler_identity(raw: Any) -> dict[str, str]:
    """The validated scheduler identity of a decision's run ({} when absent). Unknown kinds
    keep only `kind`; every field used is checked against a strict pattern."""
    if not isinstance(raw, dict) or not raw:
        return {}
    kind = raw.get("kind")
    if kind == "slurm":
        out = {"kind": "slurm", "job_id": check("scheduler.job_id", str(raw.get("job_id", "")),
                                                SLURM_JOB_ID_RE)}
        if raw.get("node"):
            out["node"] = valid_node(raw["node"])
        return out
    if kind == "kubernetes":
        out = {"kind": "kubernetes",
               "namespace": check("scheduler.namespace", raw.get("namespace"),
                                  K8S_NAMESPACE_RE)}
        if raw.get("pod"):
            out["pod"] = check("scheduler.pod", raw["pod"], K8S_NAME_RE)
        if raw.get("node"):
            out["node"] = valid_node(raw["node"])
        return out
    return {"kind": check("scheduler.kind", str(kind), RULE_ID_RE)}


def plan_decision(dec: Decision) -> list[Action]:
    """A `blacklist` decision: quarantine each target node, then requeue the job away from
    it, unless a hot spare replaced the node inside the running job (`swaps`: the node is
    drained, the job keeps its allocation). Other actions need nothing from a scheduler,
    nor does a fleet notice (job "(fleet)": a lemon node's quarantine acts through the
    registry record it leads to). Raises ConfigError on a field that does not match its
    pattern (the caller logs it with topic/partition/offset)."""
    if dec.action != "blacklist" or dec.job == NOTICE_JOB:
        return []
    did = check("decision.id", dec.id, DECISION_ID_RE)
    job = valid_job(dec.job, "decision.job")
    rule = check("decision.reason.rule", dec.rule or "unknown", RULE_ID_RE)
    if not dec.nodes:
        raise ConfigError("decision.targets.nodes", f"blacklist {did} names no node")
    sched = scheduler_identity(dec.scheduler)
    out: list[Action] = []
    swapped = {a for a, _ in dec.swaps}
    for n in dec.nodes:
        node = valid_node(n)
        out.append(Action(QUARANTINE, node, did, rule, job, sched, dec.ts))
        if node not in swapped:
            out.append(Action(REQUEUE, node, did, rule, job, sched, dec.ts))
    return out


def plan_node(rec: NodeRecord, now: float) -> list[Action]:
    """A registry record: quarantined (and not yet expired) -> quarantine; released or
    expired -> release. Keyed by the reason that caused it, so replays are no-ops."""
    node = valid_node(rec.node)
    last = rec.reasons[-1] if rec.reasons else None
    if rec.state == QUARANTINED:
        if rec.until is not None and now >= rec.until:
            return [Action(RELEASE, node, f"expire-{int(rec.until)}", ts=rec.updated_ts)]
        q = next((r for r in reversed(rec.reasons) if r.event == "quarantine"), None)
        did = q.decision if q and q.decision else f"registry-{int(rec.updated_ts)}"
        rule = q.rule if q and q.rule else "registry"
        # a quarantine a job's decision caused names the job: the scheduler confirms it
        by_job = q is not None and q.job and q.decision and not q.decision.startswith("manual-")
        job = valid_job(q.job) if by_job and q is not None else ""
        return [Action(QUARANTINE, node, check("decision.id", did, DECISION_ID_RE),
                       check("rule", rule, RULE_ID_RE), job, ts=rec.updated_ts)]
    if rec.state == HEALTHY and last is not None and last.event == "release":
        did = last.decision or f"release-{int(last.ts)}"
        return [Action(RELEASE, node, check("decision.id", did, DECISION_ID_RE),
                       ts=rec.updated_ts)]
    return []
