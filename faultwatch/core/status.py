"""A job's status snapshot (pure: time passed in): what `faultwatch status` shows and
`faultwatch diagnose` reads, published by the processors on the compacted status topic."""

from __future__ import annotations

from typing import Any

from faultwatch.core.policy import Policy
from faultwatch.core.state import JobState, thaw
from faultwatch.core.windows import choose_window, describe_basis

STATUS_S = 3.0  # how often a processor looks for snapshots to publish (streams/status_publish.py)
MAX_RANKS_SHOWN = 64  # per snapshot: the quietest ranks first
MAX_DECISIONS_SHOWN = 5
WORKER_S = 15.0  # a processor worker's record (its rules) is refreshed this often ...
STALE_S = 3 * WORKER_S  # ... and shown as stale (the worker may be gone) after this long


def _age(now: float, ts: float | None) -> float | None:
    return None if ts is None else round(max(0.0, now - ts), 1)


def snapshot(st: JobState, now: float, policy: Policy) -> dict[str, Any]:
    """What `status` shows of one job: run, attempt, nodes and ranks alive, last output age
    per rank (quietest first), open stages and the silence window in effect and why (what
    `describe` says of it), decisions."""
    stages = st.open_stages()
    window, basis = choose_window(policy, stages, st.hists, st.warmed_up)
    nodes = [{"node": n.node, "rank": n.rank, "alive": n.alive, "exit_code": n.exit_code,
              "last_output_age_s": _age(now, n.last_output_ts),
              "last_heartbeat_age_s": _age(now, n.last_hb_ts)}
             for n in sorted(st.nodes.values(), key=lambda n: n.node)]
    ranks = sorted(st.rank_last_ts.items(), key=lambda kv: kv[1])[:MAX_RANKS_SHOWN]
    return {"job": st.job, "run_id": st.run_id, "run_source": st.run_source,
            "scheduler": thaw(st.scheduler), "attempt": st.attempt, "phase": str(st.phase),
            "ts": now, "nodes_alive": sum(1 for n in st.nodes.values() if n.alive),
            "nodes_total": len(st.nodes), "expected_nodes": st.expected_nodes,
            "ranks_total": len(st.rank_last_ts), "expected_world": st.expected_world,
            "rank_last_output_age_s": [[r, _age(now, ts)] for r, ts in ranks],
            "last_output_age_s": _age(now, st.last_output_ts),
            "stages": sorted({s.stage for s in stages}), "window_s": window,
            "window_basis": basis.get("basis"), "window_why": describe_basis(basis),
            "steps": st.steps,
            "restarts_used": st.restarts_used,
            "decisions": list(st.decided[-MAX_DECISIONS_SHOWN:]), "nodes": nodes,
            **({"spares": [{"node": sp.node, "state": sp.state, "checks": sp.checks,
                            "registry": sp.registry, "replaces": sp.taken_for or None,
                            "last_note_age_s": _age(now, sp.last_ts)}
                           for sp in sorted(st.spares.values(), key=lambda s: s.node)
                           [:MAX_RANKS_SHOWN]]} if st.spares else {})}
