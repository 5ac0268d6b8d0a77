"""Turning a verdict into a Decision: ids, restart budget, storm guard, blacklist backoff."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Any

from faultwatch.core.policy import Policy

BLACKLIST_MAX_S = 7 * 24 * 3600.0
RESTART_HISTORY = 32  # restart times kept for the storm guard


def decision_id(job: str, attempt: int, kind: str, episode: str) -> str:
    """A deterministic id: the same decision made twice (after a crash) has the same id."""
    return hashlib.sha256(f"{job}\x1f{attempt}\x1f{kind}\x1f{episode}".encode()).hexdigest()[:20]


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
                    blacklist: dict[str, tuple[int, float]]
                    ) -> tuple[dict[str, tuple[int, float]], dict[str, Any]]:
    """Each blacklisting of a node doubles its duration (capped): strikes and expiry."""
    out = dict(blacklist)
    ev: dict[str, Any] = {}
    for n in nodes:
        strikes = out.get(n, (0, 0.0))[0] + 1
        dur = min(policy.blacklist_s * 2 ** (strikes - 1), BLACKLIST_MAX_S)
        out[n] = (strikes, now + dur)
        ev[n] = {"strikes": strikes, "duration_s": dur, "until": round(now + dur, 3)}
    return out, ev
