"""The job stage's side of the blast-radius guard (core/blast.py): the census of silent
jobs over the partitions this worker owns, the notice as a decision, episode logs."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping
from typing import Any

from faultwatch.core.blast import NOTICE_JOB, NOTICE_KIND, BlastGuard, Census, Notice
from faultwatch.core.decide import decision_id
from faultwatch.core.events import Decision, Heartbeat, Signal
from faultwatch.core.job import JobState, Phase
from faultwatch.core.policy import Policy
from faultwatch.eventlog import log_event

ACTIVE = (Phase.RUNNING, Phase.SETTLING)
CENSUS_REUSE_S = 1.0  # a census is reused this long (many decisions in one tick)


def silent_for_s(policy: Policy) -> float:
    """A job counts as silent together with a lost one when it sent nothing for this long:
    the lost window less the storm window, and at least half the lost window (healthy
    agents report every few seconds)."""
    return max(policy.node_lost_s - policy.fleet_storm_window_s, policy.node_lost_s / 2)


def census(parts: Iterable[Any], now: float, policy: Policy) -> Census:
    """Active jobs and their live nodes in `parts` (PartitionCache), and which of them are
    silent (silent_for_s). Nodes are counted by name, once however many jobs name them (40
    jobs one node claims are one node). An active job whose state is not cached (it left the
    cache idle) counts as silent on the nodes it last had (PartitionCache.names)."""
    threshold = now - silent_for_s(policy)
    jobs = 0
    live: set[str] = set()
    quiet_names: set[str] = set()
    silent: set[bytes] = set()
    hbs: list[float] = []
    for p in parts:
        jobs += len(p.active)
        names = p.names
        for key in p.active:
            st = p.cache.get(key)
            if st is None:
                known = names.get(key) or (key.decode(errors="replace"),)
                live.update(known)
                quiet_names.update(known)
                silent.add(key)
                continue
            quiet: list[str] = []
            alive: list[str] = []
            last_out: float | None = None
            for n in st.nodes.values():
                if not n.alive:
                    continue
                alive.append(n.node)
                if n.last_output_ts is not None:
                    last_out = max(last_out or n.last_output_ts, n.last_output_ts)
                if n.seen_at is not None and n.seen_at <= threshold:
                    quiet.append(n.node)
                    if n.last_hb_ts is not None:
                        hbs.append(n.last_hb_ts)
            live.update(alive)
            if not quiet and st.diag_asked is not None and st.phase == Phase.RUNNING \
                    and (last_out is None or st.diag_asked > last_out):
                quiet = alive  # asked for stacks in this silence: a suspected hang
            if quiet:
                silent.add(key)
                quiet_names.update(quiet)
    return Census(jobs, len(live), frozenset(silent), len(quiet_names), tuple(hbs[:10_000]),
                  frozenset(quiet_names))


def heartbeat_gap_s(old: JobState | None, group: Iterable[Signal]) -> float | None:
    """The largest gap in event time between a node's last heartbeat before and its first
    heartbeat in `group` (spooled heartbeats close the gap; a stopped agent leaves one)."""
    if old is None:
        return None
    gap: float | None = None
    seen: set[str] = set()
    for sig in group:
        if isinstance(sig, Heartbeat) and sig.node not in seen:
            seen.add(sig.node)
            ns = old.nodes.get(sig.node)
            if ns is not None and ns.last_hb_ts is not None:
                g = sig.ts - ns.last_hb_ts
                gap = g if gap is None else max(gap, g)
    return gap


def last_output(st: JobState | None) -> float:
    """The latest output (event time) of any node of the job, or -inf."""
    if st is None:
        return float("-inf")
    return max((n.last_output_ts for n in st.nodes.values() if n.last_output_ts is not None),
               default=float("-inf"))


def hold_policy(policy: Policy) -> Policy:
    """The policy a held job's signals are folded with: no hang or stall decision."""
    return dataclasses.replace(policy, hang_detection=False, progress_stall_detection=False)


def notice_decision(n: Notice, policy: Policy, rules_version: str) -> Decision:
    """The one notice of an episode, as a `notify` decision (job "(fleet)")."""
    msg = (f"{n.jobs} of {n.of_jobs} active job(s) ({n.nodes} of {n.of_nodes} node(s)) went "
           f"silent together: an infrastructure event is suspected ({n.cause}). Their "
           f"restart/blacklist/fail actions are held until they report again, at most "
           f"{policy.fleet_storm_hold_max_s:g}s; then the jobs still silent are decided at "
           f"most {policy.fleet_storm_release_per_min:g} a minute")
    return Decision(id=decision_id(NOTICE_JOB, 0, NOTICE_KIND, f"{n.episode}:{n.ts:.3f}"),
                    job=NOTICE_JOB, attempt=0, action="notify", kind=NOTICE_KIND, ts=n.ts,
                    message=msg, evidence={**n.evidence, "cause": n.cause},
                    rules_version=rules_version)


def log_guard(guard: BlastGuard, notices: list[Notice]) -> None:
    """One log line per state change (tripped, ended)."""
    for n in notices:
        log_event("fleet_storm_tripped", episode=n.episode, jobs=n.jobs, of_jobs=n.of_jobs,
                  nodes=n.nodes, of_nodes=n.of_nodes, cause=n.cause)
    for e in guard.take_ended():
        log_event("fleet_storm_ended", **e)


def guarded(decs: list[Decision], kinds: Mapping[str, Any] | frozenset[str],
            actions: frozenset[str]) -> Decision | None:
    """The first decision of `decs` the guard has a say in, or None."""
    return next((d for d in decs if d.kind in kinds and d.action in actions), None)
