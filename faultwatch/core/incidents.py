"""Incidents: what ended an attempt, from its decision's evidence: the cause, the nodes and
ranks to blame, the first sign in event time, and the work lost since the last checkpoint."""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from typing import Any

from faultwatch.core.events import Decision, Exit
from faultwatch.core.ledger import Attempt, Checkpoint, Incident, training_s

CAUSES = ("error", "hang", "node-lost", "exit-hang", "divergence", "preemption", "operator-stop")
# Rules whose match says the scheduler or the cloud took the resources away (the built-in
# scheduler.yaml and signals.yaml ids), and deaths by SIGTERM/SIGHUP with no error before them:
# what Slurm (GraceTime) and the kubelet (terminationGracePeriodSeconds) send when they preempt
# or evict.
PREEMPTION_RULES = frozenset({
    "slurm-requeue-preemption", "submitit-preempted-or-timeout", "k8s-eviction-or-disruption",
    "scheduler-preemption", "exit-sigterm", "torchrun-death-signal"})
MAX_BLAMED = 16  # nodes and ranks named per incident
MAX_MESSAGE = 300
STOP = "stop"
HELD = "held"  # the action of an incident whose decision an operator's hold turned into a notice


def cause_of(kind: str, rule: str | None) -> str:
    """The incident cause of a decision kind and root rule."""
    if kind in ("hang", "progress-stall"):
        return "hang"
    if kind in ("node-lost", "exit-hang", "divergence"):
        return kind
    if rule in PREEMPTION_RULES:
        return "preemption"
    return "error"


def _num(x: Any) -> float | None:
    if isinstance(x, bool) or not isinstance(x, int | float) or not math.isfinite(x):
        return None
    return float(x)


def _obj(x: Any) -> Mapping[str, Any]:
    return x if isinstance(x, Mapping) else {}


def first_sign(d: Decision) -> float:
    """When the failure showed first, in event time: the first error line or exit, the start
    of the silence or stall, the lost node's last heartbeat, the first node's finish; the
    decision's own time when the evidence says nothing usable."""
    ev = _obj(d.evidence)
    ts: float | None = None
    if d.kind in ("error", "exit"):
        ts = _num(_obj(ev.get("first_error")).get("ts"))
    elif d.kind == "hang":
        ts = _num(ev.get("silent_since"))
    elif d.kind == "progress-stall":
        ts = _num(ev.get("last_step_ts"))
    elif d.kind == "exit-hang":
        ts = _num(ev.get("finished_at"))
    elif d.kind == "node-lost":
        seen = [_num(_obj(v).get("last_heartbeat_ts")) for v in
                _obj(ev.get("lost_nodes")).values()]
        known = [t for t in seen if t is not None]
        ts = min(known) if known else None
    return d.ts if ts is None else ts


def blamed(d: Decision, rank_nodes: Callable[[int], str | None] | None = None
           ) -> tuple[tuple[str, ...], tuple[int, ...]]:
    """The nodes and ranks the evidence blames: the first error's node, the lost nodes, the
    hang's culprits (by name, or by rank), the nodes that did not finish."""
    ev = _obj(d.evidence)
    nodes: list[str] = []
    if d.kind in ("error", "exit"):
        node = _obj(ev.get("first_error")).get("node")
        nodes = [node] if isinstance(node, str) else []
    elif d.kind == "node-lost":
        nodes = [n for n in _obj(ev.get("lost_nodes")) if isinstance(n, str)]
    elif d.kind == "exit-hang":
        still = ev.get("still_running")
        nodes = [n for n in still if isinstance(n, str)] if isinstance(still, list) else []
    elif d.kind in ("hang", "progress-stall"):
        nodes = [n for n in _obj(ev.get("culprit_nodes")) if isinstance(n, str)]
        if not nodes and rank_nodes is not None:
            nodes = [n for n in (rank_nodes(r) for r in d.ranks) if n is not None]
    else:
        nodes = list(d.nodes)
    return tuple(dict.fromkeys(nodes))[:MAX_BLAMED], tuple(d.ranks[:MAX_BLAMED])


def lost_work(ckpt: Checkpoint | None, a: Attempt, fail_ts: float
              ) -> tuple[int | None, float | None, bool]:
    """(steps, training seconds, known) lost by `a` failing at `fail_ts`: the progress since
    the last checkpoint. Nothing is lost by an attempt that never made progress; without a
    checkpoint the loss is unknown."""
    if a.first_step_ts is None or a.first_step_ts >= fail_ts:
        return 0, 0.0, True
    if ckpt is None or ckpt.ts > fail_ts:
        return None, None, False
    start = max(ckpt.ts, a.first_step_ts)
    secs = round(training_s(a, start, fail_ts), 3)
    steps = None
    if ckpt.step is not None and a.top_step is not None:
        steps = max(0, a.top_step - ckpt.step)
    return steps, secs, True


def open_incident(ckpt: Checkpoint | None, a: Attempt, d: Decision | None, stop: Exit | None,
                  rank_nodes: Callable[[int], str | None] | None = None) -> Incident:
    """The incident of attempt `a`, ended by decision `d` or by an operator's `stop`."""
    if d is not None:
        cause, fs = cause_of(d.kind, d.rule), first_sign(d)
        action = d.action
        if action == "notify":  # held by an operator (core/holds.py): they take it from here
            cause, action = "operator-stop", HELD
        nodes, ranks = blamed(d, rank_nodes)
        head: dict[str, Any] = dict(id=d.id, cause=cause, kind=d.kind, action=action,
                                    rule=d.rule, category=d.category, detected_ts=d.ts,
                                    message=d.message[:MAX_MESSAGE])
    else:
        assert stop is not None
        fs, nodes, ranks = stop.ts, (stop.node,), ()
        head = dict(id=f"{STOP}:{a.n}", cause="operator-stop", kind="", action=STOP,
                    rule=None, category=None, detected_ts=stop.ts,
                    message=f"stopped by a signal to the agent on {stop.node}")
    steps, secs, known = lost_work(ckpt, a, fs)
    before = ckpt is not None and ckpt.ts <= fs
    return Incident(attempt=a.n, nodes=nodes, ranks=ranks, first_sign_ts=fs,
                    last_progress_ts=a.last_step_ts, last_progress_step=a.last_step,
                    ckpt_step=ckpt.step if before and ckpt is not None else None,
                    ckpt_ts=ckpt.ts if before and ckpt is not None else None,
                    lost_steps=steps, lost_s=secs, lost_known=known, **head)


def lost_phrase(i: Incident, unit: str = "step") -> str:
    """The lost work in the job's own units: "lost 6 steps, 2.4 s, since the checkpoint at
    step 20"; "lost work unknown (no checkpoint seen)"."""
    if not i.lost_known:
        return "lost work unknown (no checkpoint seen)"
    if i.lost_steps == 0 and not i.lost_s:
        return "nothing lost"
    what = []
    if i.lost_steps is not None:
        what.append(f"{i.lost_steps} {unit}{'' if i.lost_steps == 1 else 's'}")
    what.append(f"{i.lost_s or 0.0:.1f} s")
    since = ""
    if i.ckpt_ts is not None:
        since = f", since the checkpoint at {unit} {i.ckpt_step}" if i.ckpt_step is not None \
            else ", since the last checkpoint"
    return f"lost {', '.join(what)}{since}"
