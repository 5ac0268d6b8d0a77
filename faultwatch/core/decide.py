"""Turning a verdict into a Decision: ids, restart budget, storm guard, blacklist backoff."""

from __future__ import annotations

import dataclasses
import hashlib
from dataclasses import dataclass
from typing import Any

from faultwatch.core.events import Decision
from faultwatch.core.pmap import PMap
from faultwatch.core.policy import Policy
from faultwatch.core.registry import MAX_QUARANTINE_S, backoff_s
from faultwatch.core.state import (
    MAX_DECIDED,
    MAX_NOTIFY,
    JobState,
    Phase,
    Spare,
    evolve,
    thaw,
)

Result = tuple[JobState, list[Decision]]

BLACKLIST_MAX_S = MAX_QUARANTINE_S
RESTART_HISTORY = 32  # restart times kept for the storm guard


def decision_id(job: str, attempt: int, kind: str, episode: str, run_id: str = "") -> str:
    """A deterministic id: the same decision made twice (after a crash) has the same id;
    the same failure in another run of a reused job name has another."""
    key = f"{job}\x1f{attempt}\x1f{kind}\x1f{episode}" + (f"\x1f{run_id}" if run_id else "")
    return hashlib.sha256(key.encode()).hexdigest()[:20]


@dataclass(frozen=True, slots=True)
class Guarded:
    """The action after the restart budget and the storm guard, and what they add."""

    action: str
    message: str
    evidence: dict[str, Any]
    restart_times: tuple[float, ...]
    restarts_used: int


def guard_restart(action: str, message: str, now: float, policy: Policy, restarts_used: int,
                  restart_times: tuple[float, ...]) -> Guarded:
    """Restart budget, then restart-storm guard (too many restarts in a window -> fail;
    else a not-before hint that doubles with each recent restart)."""
    ev: dict[str, Any] = {}
    if action not in ("restart", "blacklist"):
        return Guarded(action, message, ev, restart_times, restarts_used)
    if not policy.enable_restart:
        return Guarded("fail", f"restart disabled: {message}", ev, restart_times, restarts_used)
    if restarts_used >= policy.max_restarts:
        return Guarded("fail", f"restart budget exhausted ({restarts_used}/"
                               f"{policy.max_restarts}): {message}", ev, restart_times,
                       restarts_used)
    recent = [t for t in restart_times if now - policy.storm_window_s < t <= now + 1e-9]
    if len(recent) >= policy.storm_max_restarts:
        ev["storm"] = {"restarts_in_window": len(recent), "window_s": policy.storm_window_s,
                       "max": policy.storm_max_restarts}
        return Guarded("fail", f"restart storm: {len(recent)} restarts in "
                               f"{policy.storm_window_s:g}s: {message}", ev, restart_times,
                       restarts_used)
    delay = policy.restart_backoff_s * (2 ** (len(recent) - 1)) if recent else 0.0
    not_before = max(now, (max(recent) + delay) if recent else now)
    ev["restart_not_before"] = round(not_before, 3)
    return Guarded(action, message, ev, (restart_times + (now,))[-RESTART_HISTORY:],
                   restarts_used + 1)


def blacklist_terms(nodes: tuple[str, ...], now: float, policy: Policy,
                    blacklist: PMap[str, tuple[int, float]]
                    ) -> tuple[PMap[str, tuple[int, float]], dict[str, Any]]:
    """Each blacklisting of a node doubles its duration (capped): strikes and expiry."""
    out = blacklist
    ev: dict[str, Any] = {}
    for n in nodes:
        strikes = out.get(n, (0, 0.0))[0] + 1
        dur = backoff_s(policy.blacklist_s, strikes)
        out = out.set(n, (strikes, now + dur))
        ev[n] = {"strikes": strikes, "duration_s": dur, "until": round(now + dur, 3)}
    return out, ev


def evidence_ts(st: JobState, now: float, conclusive_at: float | None = None) -> float:
    """When the evidence of a decision made at `now` was complete, in event time:
    `conclusive_at` (a silence that became a loss, a settle that timed out) or the newest
    evidence the state holds, never later than `now`."""
    at = conclusive_at if conclusive_at is not None else st.latest_event_ts()
    return now if at is None else min(now, at)


def take(st: JobState, swaps: tuple[tuple[str, str], ...], attempt: int) -> JobState:
    """The spares of `swaps` are taken by a decision of `attempt`: never offered again."""
    spares = st.spares
    for node, spare in swaps:
        cur: Spare | None = spares.get(spare)
        if cur is not None:
            spares = spares.set(spare, dataclasses.replace(
                cur, state="taken", taken_for=node, taken_attempt=attempt))
    return evolve(st, spares=spares)


def emit(st: JobState, kind: str, episode: str, action: str, now: float, policy: Policy,
         rv: str, *, nodes: tuple[str, ...], ranks: tuple[int, ...], rule: str | None,
         category: str | None, message: str, evidence: dict[str, Any],
         candidates: tuple[str, ...] = (),
         swaps: tuple[tuple[str, str], ...] = (), ts: float | None = None) -> Result:
    """Budget and storm guard for restarts, then publish once per (attempt, kind, episode).
    `notify` decisions leave the phase alone and cost no budget. `swaps` (hot spares
    replacing nodes, core/spares.py) stay only on a restart or blacklist that survives the
    guard; their spares are then taken. The decision's time is `ts`, the time of its
    evidence (evidence_ts), else `now`: a decision made late (a processor catching up,
    reading history) says how old what it is about is."""
    if ts is None:
        ts = now
    # a weak run id launched again (core/runs.py) is another run: its decisions other ids
    run = f"{st.run_id}#{st.run_gen}" if st.run_gen else st.run_id
    did = decision_id(st.job, st.attempt, kind, episode, run)
    run_of: dict[str, Any] = {"run_id": st.run_id, "scheduler": thaw(st.scheduler),
                           "run_ids": tuple(sorted(st.run_ids)) if len(st.run_ids) > 1 else ()}
    if did in st.decided:
        return (st if action == "notify" else dataclasses.replace(st, phase=Phase.DECIDED)), []
    decided = (st.decided + (did,))[-MAX_DECIDED:]
    if action == "notify":
        if st.notified >= MAX_NOTIFY:
            return st, []
        st = dataclasses.replace(st, decided=decided, notified=st.notified + 1)
        budgets: dict[str, object] = {"restarts_used": st.restarts_used,
                                      "max_restarts": policy.max_restarts}
        return st, [Decision(id=did, job=st.job, attempt=st.attempt, action=action, kind=kind,
                             ts=ts, nodes=nodes, ranks=ranks, rule=rule, category=category,
                             message=message, evidence=evidence, budgets=budgets,
                             rules_version=rv, **run_of)]
    g = guard_restart(action, message, now, policy, st.restarts_used, st.restart_times)
    evidence = {**evidence, **g.evidence}
    blacklist = st.blacklist
    if g.action == "blacklist":
        blacklist, terms = blacklist_terms(nodes, now, policy, st.blacklist)
        evidence["blacklist"] = terms
    acted = g.action in ("restart", "blacklist")
    if acted:
        cands = st.blacklist_candidates(policy, candidates)
        if cands:
            evidence["blacklist_candidates"] = cands
    message = g.message
    if swaps and acted:
        st = take(st, swaps, st.attempt)
        message += "; swapped in " + ", ".join(f"spare {b} for {a}" for a, b in swaps)
    elif swaps:  # the guard made it a `fail`: nothing is swapped in, and the evidence says so
        chosen = evidence.get("spares")
        evidence["spares"] = {**(chosen if isinstance(chosen, dict) else {}), "swapped": False,
                              "swaps": [], "why": f"the decision is {g.action}: no spare is "
                                                  "swapped in"}
        swaps = ()
    st = dataclasses.replace(st, phase=Phase.DECIDED, decided=decided,
                             restarts_used=g.restarts_used, restart_times=g.restart_times,
                             blacklist=blacklist, failed=g.action == "fail")
    budgets = {"restarts_used": st.restarts_used, "max_restarts": policy.max_restarts,
               "max_same_error": policy.max_same_error,
               "storm_max_restarts": policy.storm_max_restarts,
               "storm_window_s": policy.storm_window_s}
    dec = Decision(id=did, job=st.job, attempt=st.attempt, action=g.action, kind=kind, ts=ts,
                   nodes=nodes, ranks=ranks, rule=rule, category=category, message=message,
                   evidence=evidence, budgets=budgets, rules_version=rv, swaps=swaps,
                   **run_of)
    return st, [dec]
