"""Before a held, queued or replayed action runs: is it still what the registry asks for?
Pure (time passed in).

An action waits: behind the drain limits until an operator releases the hold, behind a retry,
in the journal across a crash. Meanwhile the node's registry record may have moved on (an
operator released the node, the quarantine expired, it was quarantined again). Like the
Kubernetes node lifecycle controller, which re-reads a node's conditions before each queued
eviction, actuate asks each node's latest record, and drops an action that record overtook:

- a drain (quarantine) or the requeue that goes with it, when the node's latest record is not
  a current quarantine and was written at or after the action's cause (a release, an expiry);
- a resume (release), when the latest record is a current quarantine written at or after it.

A record older than the action (the decision came first; the processor's registry record is
on its way) overtakes nothing. A node with no record: nothing to compare, the action stands.
The scheduler is asked afterwards, as for every drain made for a job (confirm.py).
"""

from __future__ import annotations

import time

from faultwatch.actuate.plan import QUARANTINE, RELEASE, REQUEUE, Action
from faultwatch.core.registry import QUARANTINED, NodeRecord, Registry


def quarantined_now(rec: NodeRecord, now: float) -> bool:
    return rec.state == QUARANTINED and (rec.until is None or now < rec.until)


def stale(action: Action, registry: Registry, now: float) -> str | None:
    """Why `action` no longer matches its node's latest registry record, or None."""
    rec = registry.get(action.node)
    if rec is None or rec.updated_ts < action.ts:
        return None
    if action.kind in (QUARANTINE, REQUEUE) and not quarantined_now(rec, now):
        expired = rec.state == QUARANTINED
        return (f"the registry shows {rec.node} "
                f"{'with its quarantine over' if expired else rec.state} since "
                f"{_iso(rec.updated_ts)}, after {action.decision}")
    if action.kind == RELEASE and quarantined_now(rec, now):
        return f"the registry shows {rec.node} quarantined again since {_iso(rec.updated_ts)}"
    return None


def _iso(ts: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(ts))
