"""Silence detectors: hang, exit hang and progress stall in event time (heartbeat evidence),
node lost in processor time.

- Hang: every live node's own heartbeat proves its output silent for the window in effect
  (windows.choose_window); before a node's first output the init window applies. A node
  whose heartbeats lag (half the node-lost window behind the freshest one) inhibits the
  hang: node-lost decides about it instead.
- Exit hang: a node exited 0 and the others still run exit_hang_window_s later.
- Progress stall: output keeps flowing, but no rank's step changed for the window.
- Node lost: a live node sent nothing for node_lost_s of processor time; only evaluated when
  the shell says its clock is trustworthy (JobState.tick(live_clock=True)).
- A root error line was printed (a rule hit that is not a cascade): for ERROR_EXIT_GRACE_S
  after it, silence and stalled steps are the failing process's teardown (torchrun is
  silent for seconds while it stops the other ranks), not a hang: the exit that follows
  is decided as the failure. Past the grace a job that printed an error and hangs is hung.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from faultwatch.core.decide import Result, emit
from faultwatch.core.pmap import PMap
from faultwatch.core.policy import Policy
from faultwatch.core.state import JobState, NodeState, Phase
from faultwatch.core.windows import (
    DEFAULT_STAGE,
    STEPS_HIST,
    WARMUP_STEPS,
    choose_window,
    describe_basis,
)

ERROR_EXIT_GRACE_S = 60.0  # after a root error line, wait this long for the exit


def error_in_flight(st: JobState, now_ev: float) -> bool:
    """A root error was printed less than ERROR_EXIT_GRACE_S ago (its exit is coming)."""
    first = min((h.match.ts for h in st.hits
                 if not h.match.cascade and h.match.stream != "exit"), default=None)
    return first is not None and now_ev - first < ERROR_EXIT_GRACE_S


def check(st: JobState, policy: Policy, rv: str) -> Result:
    """Exit hang, hang, progress stall and missing nodes, in event time (heartbeats)."""
    if st.phase != Phase.RUNNING:
        return st, []
    alive = [n for n in st.nodes.values() if n.alive]
    if not alive or any(n.last_hb_ts is None for n in alive):
        return st, []  # silence is proven by every live node's own heartbeat, or not at all
    now_ev = max(n.last_hb_ts for n in alive if n.last_hb_ts is not None)
    finished = [n for n in st.nodes.values() if n.exit_code == 0 and n.exit_ts is not None]
    if finished and policy.exit_hang_detection:
        first_done = min(n.exit_ts for n in finished if n.exit_ts is not None)
        if now_ev - first_done >= policy.exit_hang_window_s:
            ev = {"finished_nodes": sorted(n.node for n in finished),
                  "finished_at": first_done, "still_running": sorted(n.node for n in alive),
                  "window_s": policy.exit_hang_window_s,
                  "last_lines": st.last_lines_per_rank()}
            first = min(finished, key=lambda n: n.exit_ts or 0.0)
            return emit(st, "exit-hang", "exit-hang", "restart", now_ev, policy, rv,
                           nodes=tuple(sorted(st.nodes)), ranks=(), rule=None, category=None,
                           evidence=ev, message=f"{len(alive)} node(s) still running "
                                                f"{now_ev - first_done:.0f}s after "
                                                f"{first.node} finished")
    stale = now_ev - policy.node_lost_s / 2
    if any(n.last_hb_ts is not None and n.last_hb_ts < stale for n in alive):
        return st, []  # inhibited: a node's heartbeats lag; node-lost decides about it
    if error_in_flight(st, now_ev):
        return st, []  # a failing process is tearing down: its exit decides
    if policy.hang_detection:
        out = _hang(st, alive, now_ev, policy, rv)
        if out is not None:
            return out
    if policy.progress_stall_detection:
        out = _stall(st, now_ev, policy, rv)
        if out is not None:
            return out
    return _missing_nodes(st, now_ev, policy, rv)


def _hang(st: JobState, alive: list[NodeState], now_ev: float, policy: Policy,
          rv: str) -> Result | None:
    window, basis = choose_window(policy, st.open_stages(), st.hists, st.warmed_up)
    if window is None:
        return None  # a stage without hang detection is open (eval)
    silences = []
    for n in alive:
        assert n.last_hb_ts is not None
        if n.last_output_ts is None:  # nothing printed yet: imports, rendezvous, restarts
            since, w = n.started_ts, max(policy.effective_init_window_s, window)
        else:
            since, w = n.last_output_ts, window
        if n.last_hb_ts - since < w:
            return None
        silences.append((since, n))
    silent_since = max(since for since, _ in silences)
    culprit = st.quiet_first()
    evidence: dict[str, Any] = {
        "silent_since": silent_since,
        "silent_for_s": round(now_ev - silent_since, 3),
        "window_s": round(window, 3),
        "window": basis,
        "nodes": {n.node: {"last_output_ts": n.last_output_ts,
                           "last_heartbeat_ts": n.last_hb_ts} for _, n in silences},
        "rank_last_output_ts": {str(r): t for r, t in sorted(st.rank_last_ts.items())[:64]},
        "likely_culprit_rank": culprit,
        "last_lines": st.last_lines_per_rank(),
        "expected": st.expected_evidence(),
    }
    msg = f"every rank silent for {now_ev - silent_since:.1f}s (window {window:g}s, " \
          f"{describe_basis(basis)})"
    if culprit is not None:
        msg += f"; rank {culprit} went quiet first"
    return emit(st, "hang", "hang", "restart", now_ev, policy, rv, nodes=tuple(sorted(st.nodes)),
                   ranks=() if culprit is None else (culprit,), rule=None, category=None,
                   message=msg, evidence=evidence)


def _stall(st: JobState, now_ev: float, policy: Policy, rv: str) -> Result | None:
    if st.steps < WARMUP_STEPS or st.step_ts is None or st.last_output_ts is None:
        return None
    hists = PMap({DEFAULT_STAGE: st.hists[STEPS_HIST]} if STEPS_HIST in st.hists else {})
    window, basis = choose_window(policy, st.open_stages(), hists, True)
    if window is None:
        return None
    stalled = now_ev - st.step_ts
    # Output must still be flowing *now* (seen within the last half window), not just a line
    # printed after the last step: a job that went silent right after its last step is hung,
    # and the hang detector decides it (kind `hang`, with the culprit rank).
    flowing = st.last_output_ts > st.step_ts and now_ev - st.last_output_ts < window / 2
    if stalled < window or not flowing:
        return None
    last = sorted(st.progress.items(), key=lambda kv: kv[1].ts)[:8]
    evidence: dict[str, Any] = {
        "last_step_ts": st.step_ts, "stalled_for_s": round(stalled, 3),
        "window_s": round(window, 3), "window": basis, "last_output_ts": st.last_output_ts,
        "steps": {str(r): {"step": p.step, "since": p.ts} for r, p in last},
        "last_lines": st.last_lines_per_rank(),
    }
    msg = f"no step advanced for {stalled:.1f}s while output continued (window {window:g}s)"
    return emit(st, "progress-stall", "progress-stall", "restart", now_ev, policy, rv,
                   nodes=tuple(sorted(st.nodes)), ranks=(), rule=None, category=None,
                   message=msg, evidence=evidence)


def _missing_nodes(st: JobState, now_ev: float, policy: Policy, rv: str) -> Result:
    expected = st.expected_nodes
    if not expected or len(st.nodes) >= expected or "missing" in st.flags:
        return st, []
    first = min(n.started_ts for n in st.nodes.values())
    if now_ev - first < policy.skew_warn_s:
        return st, []
    st = dataclasses.replace(st, flags=st.flags | {"missing"})
    missing = expected - len(st.nodes)
    return emit(st, "skew", "missing-nodes", "notify", now_ev, policy, rv, nodes=(), ranks=(),
                   rule=None, category=None,
                   message=f"{missing} of {expected} node(s) not started "
                           f"{now_ev - first:.0f}s after the first",
                   evidence={"expected": st.expected_evidence(), "first_start_ts": first,
                             "started": sorted(st.nodes)})


def check_lost(st: JobState, now: float, policy: Policy, rv: str) -> Result:
    """Node lost: a live node sent nothing for node_lost_s of processor time."""
    lost = [n for n in st.nodes.values() if n.alive and n.seen_at is not None
            and now - n.seen_at >= policy.node_lost_s]
    if not lost:
        return st, []
    names = tuple(sorted(n.node for n in lost))
    evidence: dict[str, Any] = {
        "lost_nodes": {n.node: {"last_heartbeat_ts": n.last_hb_ts, "last_seen_at": n.seen_at,
                                "silent_for_s": round(now - (n.seen_at or now), 3)}
                       for n in lost},
        "window_s": policy.node_lost_s, "last_lines": st.last_lines_per_rank(),
    }
    targets = tuple(sorted(st.nodes)) if policy.execution_mode == "sync" else names
    return emit(st, "node-lost", "node-lost", "restart", now, policy, rv, nodes=targets, ranks=(),
                   rule=None, category=None, candidates=names, evidence=evidence,
                   message=f"no heartbeat from {', '.join(names)} for "
                           f"{now - max(n.seen_at or now for n in lost):.0f}s "
                           f"(window {policy.node_lost_s:g}s)")
