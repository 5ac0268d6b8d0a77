"""Hot spares (pure, time passed in): nodes of the run's allocation that wait, checked, to
replace a bad node inside the running job instead of a requeue.

A spare agent (`faultwatch agent --spare`, or one of the last K nodes under `--spares K`)
registers at once, runs its boot checks (a spare still checking is never chosen) and sends a
`spare` note every few seconds while it waits. It sends no
run-start, so it is no node of an attempt: no hang, settle or node-lost is decided about it.
Its notes say how its checks went and whether another job's spare already runs on its node
(`busy`, from the agent's node lock); the processor's gate stamps the node registry's state
of it (`registry`) on each note, so the registry is asked in one place.

When a failure blacklists an active node, or an active node is lost, `plan` pairs each bad
node with a spare that may replace it. A spare may replace one when it is waiting (not taken
by an earlier swap, lost or declined), was heard from within `node_lost_s` of processor
time, its boot checks did not fail, the registry does not quarantine it, no other job's spare
runs on its node, the job has not blacklisted it, and it is not an active node of the job.
Healthy spares come before suspect ones, then the longest waiting, then by name. Every bad
node gets a spare or none does (the job needs its N nodes): without one the decision is what
it would be without spares (a blacklist: the bad node's agent exits 138 and the scheduler
requeues the job) and its evidence says why no spare was taken. A bad node that hosts the
launch's rendezvous endpoint is never swapped (torchrun's c10d store lives in the torchrun
process on that host: the others cannot meet again without it).

A spare that stops sending notes for `node_lost_s` is lost: a `notify` (kind node-lost,
`evidence.spare: true`), never a restart; a spare whose checks fail is reported once.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from faultwatch.core.decide import Result, emit
from faultwatch.core.events import Decision, Notice
from faultwatch.core.policy import Policy
from faultwatch.core.state import JobState, Spare, evolve

SPARE_NOTE = "spare"  # the note kind of spares (and of active nodes' rendezvous role)
WAITING, TAKEN, LOST, DECLINED = "waiting", "taken", "lost", "declined"
LEAVING = "leaving"  # a note's state: the spare agent stops (signalled, run over)
CHECKS = ("passed", "failed", "running", "off")
REGISTRY = ("healthy", "suspect", "quarantined")
MAX_SPARES = 256  # spares kept per run (more are not registered)
MAX_SHOWN = 16  # spares described in a decision's evidence
MAX_NAME = 256

Swaps = tuple[tuple[str, str], ...]


# ---- notes -------------------------------------------------------------------------------

def on_note(st: JobState, ev: Notice, now: float, policy: Policy, rv: str) -> Result:
    """Fold a `spare` note: an active node saying whether it hosts the rendezvous, or a
    spare registering, staying alive, declining a swap or leaving. Spares live across the
    run's attempts: a note is folded whatever attempt it names."""
    d = ev.data if isinstance(ev.data, dict) else {}
    if d.get("role") == "active":
        hosts = st.rdzv_hosts | {ev.node} if d.get("rdzv_host") is True \
            else st.rdzv_hosts - {ev.node}
        return (st if hosts == st.rdzv_hosts else evolve(st, rdzv_hosts=hosts)), []
    cur: Spare | None = st.spares.get(ev.node)
    said = d.get("state", WAITING)
    if said == LEAVING:
        return (evolve(st, spares=st.spares.remove(ev.node)) if cur is not None else st), []
    if ev.node in st.nodes or (cur is None and len(st.spares) >= MAX_SPARES):
        return st, []  # an active node of this attempt is no spare; the table is full
    if cur is not None and ev.ts < cur.last_ts:
        return st, []  # an older note, late
    checks = str(d.get("checks")) if d.get("checks") in CHECKS else "off"
    listed = d.get("failed")
    failed = tuple(x[:64] for x in listed[:16] if isinstance(x, str)) \
        if isinstance(listed, list) else ()
    registry = str(d.get("registry")) if d.get("registry") in REGISTRY else "healthy"
    busy = d.get("busy")
    busy = busy if isinstance(busy, str) else ""
    fields: dict[str, Any] = dict(last_ts=ev.ts, seen_at=now, checks=checks, failed=failed,
                                  registry=registry, busy=busy[:MAX_NAME])
    if cur is None:
        new = Spare(node=ev.node, since=ev.ts, **fields)
    else:
        state = cur.state
        if said == DECLINED and state == TAKEN:
            state = DECLINED
        elif said == WAITING and state in (LOST, DECLINED):
            state = WAITING  # back (a lost spare's notes resumed, a declined one waits on)
        new = dataclasses.replace(cur, state=state, **fields)
    st = evolve(st, spares=st.spares.set(ev.node, new))
    if new.state == DECLINED and (cur is None or cur.state != DECLINED):
        return _declined(st, new, ev.ts, policy, rv)
    if checks == "failed" and (cur is None or cur.checks != "failed"):
        return _checks_failed(st, new, ev.ts, policy, rv)
    return st, []


def started(st: JobState, node: str) -> JobState:
    """A run-start from `node`: it is an active node now (a spare swapped in), no spare."""
    return evolve(st, spares=st.spares.remove(node)) if node in st.spares else st


def _checks_failed(st: JobState, sp: Spare, ts: float, policy: Policy, rv: str) -> Result:
    names = ", ".join(sp.failed) or "?"
    return emit(st, "bootcheck", f"spare-checks:{sp.node}:{sp.since:.3f}", "notify", ts, policy,
                rv, nodes=(sp.node,), ranks=(), rule=None, category="hardware",
                message=f"spare {sp.node} failed its boot checks ({names}): it is never "
                        "swapped in",
                evidence={"spare": True, "node": sp.node, "failed_checks": list(sp.failed),
                          "blacklist_candidate": True})


def _declined(st: JobState, sp: Spare, ts: float, policy: Policy, rv: str) -> Result:
    why = f"another job's spare runs on it ({sp.busy})" if sp.busy else "it could not start"
    return emit(st, "node-lost", f"spare-declined:{sp.node}:{sp.taken_attempt}", "notify", ts,
                policy, rv, nodes=(sp.node,), ranks=(), rule=None, category=None,
                message=f"spare {sp.node} declined to replace {sp.taken_for}: {why}; the "
                        f"job misses that node",
                evidence={"spare": True, "node": sp.node, "replacing": sp.taken_for,
                          "busy": sp.busy})


# ---- choosing ------------------------------------------------------------------------------

def why_not(st: JobState, sp: Spare, now: float, policy: Policy) -> str | None:
    """Why `sp` may not replace a node now, or None when it may."""
    if sp.state != WAITING:
        return sp.state
    if now - sp.seen_at >= policy.node_lost_s:
        return f"silent for {now - sp.seen_at:.0f}s"
    if sp.checks == "failed":
        return "boot checks failed: " + (", ".join(sp.failed) or "?")
    if sp.checks == "running":
        return "boot checks still running"
    if sp.registry == "quarantined":
        return "quarantined in the node registry"
    if sp.busy:
        return f"another job's spare runs on it ({sp.busy})"
    if sp.node in st.nodes:
        return "an active node of the job"
    bl = st.blacklist.get(sp.node)
    if bl is not None and bl[1] > now:
        return "blacklisted by this job"
    return None


def candidates(st: JobState, now: float, policy: Policy) -> tuple[list[str], dict[str, str]]:
    """The spares that may replace a node, best first, and why each other one may not."""
    ok: list[Spare] = []
    refused: dict[str, str] = {}
    for sp in st.spares.values():
        why = why_not(st, sp, now, policy)
        if why is None:
            ok.append(sp)
        else:
            refused[sp.node] = why
    ok.sort(key=lambda s: (s.registry != "healthy", s.since, s.node))
    return [s.node for s in ok], refused


def plan(st: JobState, out: tuple[str, ...], now: float, policy: Policy
         ) -> tuple[Swaps, dict[str, Any] | None]:
    """Which spare replaces which of the `out` nodes (all or none), and the evidence of the
    choice; ((), None) when the run has no spares at all."""
    if not st.spares or not out:
        return (), None
    shown = describe(st, now, policy)
    hosts = sorted(n for n in out if n in st.rdzv_hosts)
    if hosts:
        return (), {"swapped": False, "spares": shown,
                    "why": f"{', '.join(hosts)} hosts the launch's rendezvous endpoint: the "
                           "other nodes cannot meet again without it"}
    ok, refused = candidates(st, now, policy)
    need = sorted(set(out))
    if len(ok) < len(need):
        return (), {"swapped": False, "spares": shown,
                    "why": f"{len(need)} node(s) to replace, {len(ok)} spare(s) may replace "
                           "one" + (f" ({len(refused)} may not)" if refused else "")}
    swaps = tuple(zip(need, ok, strict=False))
    return swaps, {"swapped": True, "spares": shown,
                   "swaps": [{"node": a, "spare": b} for a, b in swaps]}


def describe(st: JobState, now: float, policy: Policy) -> dict[str, Any]:
    """The run's spares for evidence and status: state, checks, registry, why not."""
    out: dict[str, Any] = {}
    for sp in sorted(st.spares.values(), key=lambda s: (s.since, s.node))[:MAX_SHOWN]:
        out[sp.node] = {"state": sp.state, "checks": sp.checks, "registry": sp.registry,
                        "waiting_since": sp.since, "why_not": why_not(st, sp, now, policy)}
    return out


def restart_nodes(st: JobState, out: tuple[str, ...], swaps: Swaps, policy: Policy
                  ) -> list[str]:
    """Who relaunches after a swap: in sync mode every node but the replaced ones, and the
    spares; in async mode the spares only (the others keep running)."""
    gone = set(out)
    new = {s for _, s in swaps}
    if policy.execution_mode == "sync":
        return sorted((set(st.nodes) - gone) | new)
    return sorted(new)


# ---- liveness ------------------------------------------------------------------------------

def earliest_seen(st: JobState) -> float | None:
    """Processor time of the least recently heard-from waiting spare, or None."""
    seen = [s.seen_at for s in st.spares.values() if s.state == WAITING]
    return min(seen) if seen else None


def check_lost(st: JobState, now: float, policy: Policy, rv: str) -> Result:
    """A waiting spare silent for node_lost_s of processor time is lost: a notice (it is no
    longer swapped in), never a restart."""
    decs: list[Decision] = []
    for sp in sorted(st.spares.values(), key=lambda s: s.node):
        if sp.state != WAITING or now - sp.seen_at < policy.node_lost_s:
            continue
        st = evolve(st, spares=st.spares.set(sp.node, dataclasses.replace(sp, state=LOST)))
        silent = round(now - sp.seen_at, 3)
        st, d = emit(st, "node-lost", f"spare-lost:{sp.node}:{sp.seen_at:.3f}", "notify", now,
                     policy, rv, nodes=(sp.node,), ranks=(), rule=None, category=None,
                     message=f"spare {sp.node} sent nothing for {silent:.0f}s (window "
                             f"{policy.node_lost_s:g}s): it is no longer swapped in",
                     evidence={"spare": True, "node": sp.node, "last_note_ts": sp.last_ts,
                               "last_seen_at": sp.seen_at, "silent_for_s": silent,
                               "window_s": policy.node_lost_s, "blacklist_candidate": True})
        decs += d
    return st, decs
