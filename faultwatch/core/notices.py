"""Warnings that become `notify` decisions, and SDK/agent notes that change a job's policy.

- skew: the nodes of an attempt started more than skew_warn_s apart (seed 000: late image
  pulls killed a torchrun rendezvous), or expected nodes never started (silence.py).
- slow: a rank's smoothed SDK step time stays above slow_factor x the job's median for
  SLOW_STRIKES scans; a node slow in two attempts is a blacklist candidate.
- custom: the SDK's `faultwatch.sdk.notify(message, level)` (`notify` notes).
- bootcheck: a node's boot checks failed (the node becomes a blacklist candidate).
- gap: the agent dropped output (spool cap) — decisions may lack evidence.
- retryable_errors notes add job-specific retryable patterns (failure.py applies them).
"""

from __future__ import annotations

import dataclasses
import hashlib
from typing import Any

from faultwatch.core.decide import Result, emit
from faultwatch.core.events import Decision, Notice, Progress, RunStart
from faultwatch.core.policy import Policy
from faultwatch.core.progress import SLOW_CHECK_S, scan_slow
from faultwatch.core.state import JobState

MAX_PATTERNS = 64
MAX_TOKEN = 64
MAX_RANK = 10_000_000


def _episode(*parts: object) -> str:
    return hashlib.sha256("\x1f".join(map(str, parts)).encode()).hexdigest()[:16]


def on_start(st: JobState, ev: RunStart, policy: Policy, rv: str) -> Result:
    if len(st.nodes) < 2 or "skew" in st.flags:
        return st, []
    starts = sorted((n.started_ts, n.node) for n in st.nodes.values())
    spread = starts[-1][0] - starts[0][0]
    if spread < policy.skew_warn_s:
        return st, []
    st = dataclasses.replace(st, flags=st.flags | {"skew"})
    return emit(st, "skew", "start-skew", "notify", ev.ts, policy, rv,
                   nodes=(starts[-1][1],), ranks=(), rule=None, category=None,
                   message=f"nodes started {spread:.0f}s apart: {starts[0][1]} first, "
                           f"{starts[-1][1]} last (warn at {policy.skew_warn_s:g}s)",
                   evidence={"spread_s": round(spread, 3), "window_s": policy.skew_warn_s,
                             "starts": {n: t for t, n in starts[:16] + starts[-16:]},
                             "expected": st.expected_evidence()})


def on_progress(st: JobState, ev: Progress, policy: Policy, rv: str) -> Result:
    if ev.step_time_s is None or not policy.slow_rank_detection:
        return st, []
    if st.slow_check_ts is not None and ev.ts - st.slow_check_ts < SLOW_CHECK_S:
        return st, []
    progress, reached, med = scan_slow(st.progress, policy.slow_factor)
    st = dataclasses.replace(st, progress=progress, slow_check_ts=ev.ts)
    decs: list[Decision] = []
    for rank, rp in reached:
        flag = f"slow:{rank}"
        if flag in st.flags:
            continue
        node = rp.node or _node_of_rank(st, rank) or ev.node
        flags = st.flags | {flag}
        slow_nodes = st.slow_nodes
        if f"slownode:{node}" not in flags:
            flags = flags | {f"slownode:{node}"}
            slow_nodes = slow_nodes.set(node, slow_nodes.get(node, 0) + 1)
        st = dataclasses.replace(st, flags=flags, slow_nodes=slow_nodes)
        assert rp.step_time_s is not None
        st, d = emit(st, "slow", f"slow:{rank}", "notify", ev.ts, policy, rv, nodes=(node,),
                        ranks=(rank,) if rank >= 0 else (), rule=None, category=None,
                        message=f"rank {rank} on {node} is slow: step {rp.step_time_s:.3f}s vs "
                                f"median {med:.3f}s ({rp.step_time_s / med:.1f}x)"
                                if med > 0 else f"rank {rank} on {node} is slow",
                        evidence={"rank": rank if rank >= 0 else None, "node": node,
                                  "step_time_s": round(rp.step_time_s, 4),
                                  "median_s": round(med, 4), "factor": policy.slow_factor,
                                  "attempts_slow": slow_nodes.get(node, 0),
                                  "blacklist_candidate": slow_nodes.get(node, 0) >= 2})
        decs.extend(d)
    return st, decs


def _token(x: object, default: str) -> str:
    """A short printable word from free-form SDK data (a level), else the default."""
    return x if isinstance(x, str) and 0 < len(x) <= MAX_TOKEN and x.isprintable() else default


def _node_of_rank(st: JobState, rank: int) -> str | None:
    for n in st.nodes.values():
        if n.rank == rank:
            return n.node
    return None


def on_notice(st: JobState, ev: Notice, policy: Policy, rv: str) -> Result:
    d: dict[str, Any] = dict(ev.data)
    if ev.kind == "retryable_errors":
        pats = [str(p) for p in d.get("patterns") or () if str(p)]
        merged = tuple(dict.fromkeys(st.retryable + tuple(pats)))[:MAX_PATTERNS]
        return dataclasses.replace(st, retryable=merged), []
    if ev.kind == "notify":
        msg = str(d.get("message", ""))[:2000]
        level = _token(d.get("level"), "info")
        rank = d.get("rank")
        ranks = (rank,) if type(rank) is int and 0 <= rank <= MAX_RANK else ()
        return emit(st, "custom", _episode(ev.node, ev.ts, msg), "notify", ev.ts, policy, rv,
                       nodes=(ev.node,), ranks=ranks, rule=None,
                       category=level, message=msg,
                       evidence={"level": level, "node": ev.node, "ts": ev.ts})
    if ev.kind == "bootcheck":
        if d.get("ok", True) or d.get("when") == "spare":
            return st, []  # a waiting spare's checks are judged with it (core/spares.py)
        checks = [c for c in d.get("checks") or () if isinstance(c, dict)]
        bad = [c for c in checks if not c.get("ok", True)]
        st = dataclasses.replace(st, flags=st.flags | {f"boot:{ev.node}"})
        names = ", ".join(str(c.get("name")) for c in bad[:8]) or "?"
        return emit(st, "bootcheck", f"boot:{ev.node}", "notify", ev.ts, policy, rv,
                       nodes=(ev.node,), ranks=(), rule=None, category="hardware",
                       message=f"boot checks failed on {ev.node}: {names}",
                       evidence={"node": ev.node, "failed": bad[:32],
                                 "blacklist_candidate": True})
    if ev.kind == "gap":
        lines = d.get("dropped_lines", d.get("lines"))
        return emit(st, "gap", _episode(ev.node, ev.ts), "notify", ev.ts, policy, rv,
                       nodes=(ev.node,), ranks=(), rule=None, category=None,
                       message=f"{ev.node} dropped {lines if lines is not None else 'some'} "
                               f"output line(s) ({d.get('reason', 'gap')})",
                       evidence={"node": ev.node, **{k: v for k, v in d.items()
                                                     if isinstance(v, int | float | str)}})
    return st, []
