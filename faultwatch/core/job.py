"""The per-job state machine: signals in, decisions out, time passed in, no I/O."""

from __future__ import annotations

import dataclasses
import hashlib
from dataclasses import dataclass, field
from typing import Any

from faultwatch.core.events import (
    Decision,
    Exit,
    Heartbeat,
    Hit,
    Match,
    Output,
    RunStart,
    Signal,
    TailLine,
)
from faultwatch.core.policy import Policy
from faultwatch.core.root import default_action, pick_root

MAX_HITS = 64  # hits kept per attempt (the earliest ones: the root is among them)
MAX_TAIL = 32  # recent lines kept per job as silence evidence
MAX_CONTEXT = 40  # traceback lines carried in a decision's evidence

RUNNING, SETTLING, DECIDED, DONE = "running", "settling", "decided", "done"


def decision_id(job: str, attempt: int, kind: str, episode: str) -> str:
    """A deterministic id: the same decision made twice (after a crash) has the same id."""
    return hashlib.sha256(f"{job}\x1f{attempt}\x1f{kind}\x1f{episode}".encode()).hexdigest()[:20]


@dataclass(frozen=True)
class NodeState:
    """What the job processor knows about one node's child in the current attempt."""

    node: str
    started_ts: float
    run_id: str = ""
    world_size: int | None = None
    rank: int | None = None
    alive: bool = True
    exit_code: int | None = None
    signal: int | None = None
    exit_ts: float | None = None
    last_output_ts: float | None = None
    last_hb_ts: float | None = None


@dataclass(frozen=True)
class JobState:
    """One job's state; every transition returns a new value."""

    job: str
    attempt: int = 0
    phase: str = RUNNING
    nodes: dict[str, NodeState] = field(default_factory=dict)
    hits: tuple[Hit, ...] = ()
    rank_last_ts: dict[int, float] = field(default_factory=dict)
    tail: tuple[TailLine, ...] = ()
    failure_seen_at: float | None = None
    restarts_used: int = 0
    same_error: dict[str, int] = field(default_factory=dict)
    decided: tuple[str, ...] = ()

    # ---- transitions -------------------------------------------------------------------

    def apply(self, sig: Signal, now: float, policy: Policy,
              rules_version: str = "") -> tuple[JobState, list[Decision]]:
        """Fold one signal into the state; may decide (hang, exit hang) from its evidence."""
        if sig.attempt < self.attempt:
            return self, []  # a late record of an attempt that was already replaced
        st = self
        if sig.attempt > self.attempt:
            st = st._new_attempt(sig.attempt)
        if isinstance(sig, RunStart):
            st = st._on_start(sig)
        elif isinstance(sig, Output):
            st = st._on_output(sig)
        elif isinstance(sig, Hit):
            if len(st.hits) < MAX_HITS:
                st = dataclasses.replace(st, hits=st.hits + (sig,))
        elif isinstance(sig, Heartbeat):
            st = st._on_heartbeat(sig)
            return st._check_silence(policy, rules_version)
        elif isinstance(sig, Exit):
            st = st._on_exit(sig, now)
            if st.phase == RUNNING:
                return st._check_silence(policy, rules_version)
        return st, []

    def tick(self, now: float, policy: Policy,
             rules_version: str = "") -> tuple[JobState, list[Decision]]:
        """Advance processor time: a failure is decided once its settle time has passed."""
        if self.phase == SETTLING and self.failure_seen_at is not None \
                and now >= self.failure_seen_at + policy.settle_s:
            return self._decide_failure(now, policy, rules_version)
        return self, []

    # ---- folding -----------------------------------------------------------------------

    def _new_attempt(self, attempt: int) -> JobState:
        return dataclasses.replace(self, attempt=attempt, phase=RUNNING, nodes={}, hits=(),
                                   rank_last_ts={}, tail=(), failure_seen_at=None)

    def _on_start(self, ev: RunStart) -> JobState:
        ns = NodeState(node=ev.node, started_ts=ev.ts, run_id=ev.run_id,
                       world_size=ev.world_size, rank=ev.rank)
        phase = RUNNING if self.phase == DONE else self.phase
        return dataclasses.replace(self, nodes={**self.nodes, ev.node: ns}, phase=phase)

    def _node(self, node: str, ts: float) -> NodeState:
        return self.nodes.get(node) or NodeState(node=node, started_ts=ts)

    def _on_output(self, ev: Output) -> JobState:
        ns = self._node(ev.node, ev.ts)
        last = max(ns.last_output_ts or ev.ts, ev.ts)
        ranks = dict(self.rank_last_ts)
        for rank, ts in ev.rank_last_ts:
            key = -1 if rank is None else rank
            ranks[key] = max(ranks.get(key, ts), ts)
        tail = (self.tail + ev.tail)[-MAX_TAIL:]
        return dataclasses.replace(self, nodes={**self.nodes, ev.node: dataclasses.replace(
            ns, last_output_ts=last)}, rank_last_ts=ranks, tail=tail)

    def _on_heartbeat(self, ev: Heartbeat) -> JobState:
        ns = self._node(ev.node, ev.started_ts or ev.ts)
        last = ns.last_output_ts
        if ev.last_output_ts is not None:
            last = max(last or ev.last_output_ts, ev.last_output_ts)
        alive = ev.alive and ns.exit_ts is None
        ns = dataclasses.replace(ns, last_output_ts=last, last_hb_ts=ev.ts, alive=alive)
        return dataclasses.replace(self, nodes={**self.nodes, ev.node: ns})

    def _on_exit(self, ev: Exit, now: float) -> JobState:
        ns = dataclasses.replace(self._node(ev.node, ev.ts), alive=False, exit_code=ev.exit_code,
                                 signal=ev.signal, exit_ts=ev.ts)
        st = dataclasses.replace(self, nodes={**self.nodes, ev.node: ns})
        if st.phase != RUNNING:
            return st
        if ev.exit_code != 0:
            return dataclasses.replace(st, phase=SETTLING, failure_seen_at=now)
        if all(not n.alive and n.exit_code == 0 for n in st.nodes.values()):
            return dataclasses.replace(st, phase=DONE)
        return st

    # ---- deciding ----------------------------------------------------------------------

    def _check_silence(self, policy: Policy, rv: str) -> tuple[JobState, list[Decision]]:
        if self.phase != RUNNING:
            return self, []
        alive = [n for n in self.nodes.values() if n.alive]
        if not alive or any(n.last_hb_ts is None for n in alive):
            return self, []  # silence is proven by every live node's own heartbeat, or not at all
        finished = [n for n in self.nodes.values() if n.exit_code == 0 and n.exit_ts is not None]
        if finished and policy.exit_hang_detection:
            first_done = min(n.exit_ts for n in finished if n.exit_ts is not None)
            now_ev = max(n.last_hb_ts for n in alive if n.last_hb_ts is not None)
            if now_ev - first_done >= policy.exit_hang_window_s:
                ev = {"finished_nodes": sorted(n.node for n in finished),
                      "finished_at": first_done, "still_running": sorted(n.node for n in alive),
                      "window_s": policy.exit_hang_window_s}
                return self._restart_or_fail("exit-hang", "exit-hang", now_ev, policy, rv,
                                             evidence=ev, ranks=(),
                                             message=f"{len(alive)} node(s) still running "
                                                     f"{now_ev - first_done:.0f}s after "
                                                     f"{finished[0].node} finished")
        if not policy.hang_detection:
            return self, []
        silences = []
        for n in alive:
            assert n.last_hb_ts is not None
            if n.last_output_ts is None:  # nothing printed yet: imports, rendezvous, restarts
                since, window = n.started_ts, policy.effective_init_window_s
            else:
                since, window = n.last_output_ts, policy.hang_window_s
            silences.append((n.last_hb_ts - since, since, n))
            if n.last_hb_ts - since < window:
                return self, []
        now_ev = max(n.last_hb_ts for _, _, n in silences if n.last_hb_ts is not None)
        silent_since = max(since for _, since, _ in silences)
        culprit = self._quiet_first()
        evidence: dict[str, Any] = {
            "silent_since": silent_since,
            "silent_for_s": round(now_ev - silent_since, 3),
            "window_s": policy.hang_window_s,
            "nodes": {n.node: {"last_output_ts": n.last_output_ts,
                               "last_heartbeat_ts": n.last_hb_ts} for _, _, n in silences},
            "rank_last_output_ts": {str(r): t for r, t in sorted(self.rank_last_ts.items())},
            "likely_culprit_rank": culprit,
            "last_lines": self._last_lines_per_rank(),
        }
        msg = (f"every rank silent for {now_ev - silent_since:.1f}s "
               f"(window {policy.hang_window_s:g}s)")
        if culprit is not None:
            msg += f"; rank {culprit} went quiet first"
        return self._restart_or_fail("hang", "hang", now_ev, policy, rv, evidence=evidence,
                                     ranks=() if culprit is None else (culprit,), message=msg)

    def _quiet_first(self) -> int | None:
        ranked = [(ts, r) for r, ts in self.rank_last_ts.items() if r >= 0]
        if len(ranked) < 2:
            return None
        ranked.sort()
        return ranked[0][1] if ranked[0][0] < ranked[1][0] else None

    def _last_lines_per_rank(self, per_rank: int = 3) -> dict[str, list[str]]:
        out: dict[str, list[str]] = {}
        for t in reversed(self.tail):
            key = "?" if t.rank is None else str(t.rank)
            lines = out.setdefault(key, [])
            if len(lines) < per_rank:
                lines.insert(0, t.text)
        return out

    def _decide_failure(self, now: float, policy: Policy,
                        rv: str) -> tuple[JobState, list[Decision]]:
        matches = [h.match for h in self.hits]
        root = pick_root(matches)
        root_hit = next((h for h in self.hits if h.match is root), None)
        failed = sorted((n for n in self.nodes.values() if n.exit_code not in (None, 0)),
                        key=lambda n: n.exit_ts or 0.0)
        first = failed[0] if failed else None
        category = root.category if root else "unknown"
        evidence: dict[str, Any] = {
            "exits": {n.node: {"exit_code": n.exit_code, "signal": n.signal, "ts": n.exit_ts}
                      for n in self.nodes.values() if n.exit_ts is not None},
            "matches": [{"node": h.node, "rank": h.match.rank, "rule": h.match.rule,
                         "cascade": h.match.cascade, "ts": h.match.ts, "line": h.match.line}
                        for h in self.hits[:10]],
        }
        if root is not None and root_hit is not None:
            evidence["first_error"] = {
                "node": root_hit.node, "rank": root.rank, "ts": root.ts, "rule": root.rule,
                "stream": root.stream, "line": root.line,
                "traceback": list(root.context[-MAX_CONTEXT:]), "cascade_only": root.cascade}
        if root is None and first is not None:
            evidence["first_error"] = {"node": first.node, "rank": first.rank, "ts": first.exit_ts,
                                       "rule": None, "line": None, "traceback": [],
                                       "exit_code": first.exit_code}
        ranks = (root.rank,) if root is not None and root.rank is not None else ()
        kind = "error" if root is not None and root.stream != "exit" else "exit"
        if root is not None:
            desc = f"{root.rule} ({category})" + (" [cascade only]" if root.cascade else "")
            where = f" on {root_hit.node if root_hit else '?'}"
            where += f" rank {root.rank}" if root.rank is not None else ""
            message = f"{desc}{where}: {root.line}"
        elif first is not None:
            message = f"{first.node} exited with code {first.exit_code}, no rule matched"
        else:
            message = "a process failed, no rule matched"
        action = self._failure_action(root, category, policy)
        st = self
        if root is not None and action in ("restart", "blacklist"):
            key = f"{root.rule}@{root_hit.node if root_hit else ''}#{root.rank}"
            count = self.same_error.get(key, 0) + 1
            st = dataclasses.replace(st, same_error={**self.same_error, key: count})
            evidence["same_error_count"] = count
            if count > policy.max_same_error:
                action = "fail"
                message = f"same error {count} times (max {policy.max_same_error}): {message}"
        if action in ("restart", "blacklist") and policy.execution_mode == "async" \
                and policy.max_failure_rate != -1 and self.nodes:
            rate = len(failed) / len(self.nodes)
            evidence["failure_rate"] = rate
            if rate > policy.max_failure_rate:
                action = "fail"
                message = f"failure rate {rate:.2f} > {policy.max_failure_rate}: {message}"
        nodes: tuple[str, ...]
        if action == "blacklist":
            nodes = (root_hit.node,) if root_hit else tuple(n.node for n in failed[:1])
        elif policy.execution_mode == "async" and action == "restart":
            nodes = tuple(n.node for n in failed)
        else:
            nodes = tuple(sorted(self.nodes))
        return st._emit(kind, "failure", action, now, policy, rv, nodes=nodes, ranks=ranks,
                        rule=root.rule if root else None, category=category, message=message,
                        evidence=evidence)

    def _failure_action(self, root: Match | None, category: str, policy: Policy) -> str:
        if policy.fault_tolerant_policy == "never":
            return "fail"
        if root is not None and root.action:
            return root.action
        if policy.fault_tolerant_policy == "on_failure":
            return "blacklist" if category == "hardware" else "restart"
        return default_action(category) or "fail"

    def _restart_or_fail(self, kind: str, episode: str, now: float, policy: Policy, rv: str,
                         *, evidence: dict[str, Any], ranks: tuple[int, ...],
                         message: str) -> tuple[JobState, list[Decision]]:
        return self._emit(kind, episode, "restart", now, policy, rv,
                          nodes=tuple(sorted(self.nodes)), ranks=ranks, rule=None,
                          category=None, message=message, evidence=evidence)

    def _emit(self, kind: str, episode: str, action: str, now: float, policy: Policy, rv: str,
              *, nodes: tuple[str, ...], ranks: tuple[int, ...], rule: str | None,
              category: str | None, message: str,
              evidence: dict[str, Any]) -> tuple[JobState, list[Decision]]:
        """Apply the restart budget, then publish once per (attempt, kind, episode)."""
        if action in ("restart", "blacklist"):
            if not policy.enable_restart:
                action, message = "fail", f"restart disabled: {message}"
            elif self.restarts_used >= policy.max_restarts:
                action = "fail"
                message = f"restart budget exhausted ({self.restarts_used}/" \
                          f"{policy.max_restarts}): {message}"
        did = decision_id(self.job, self.attempt, kind, episode)
        st = dataclasses.replace(self, phase=DECIDED, decided=(self.decided + (did,))[-32:])
        if did in self.decided:
            return st, []
        if action in ("restart", "blacklist"):
            st = dataclasses.replace(st, restarts_used=self.restarts_used + 1)
        budgets: dict[str, object] = {"restarts_used": st.restarts_used,
                                      "max_restarts": policy.max_restarts,
                                      "max_same_error": policy.max_same_error}
        dec = Decision(id=did, job=self.job, attempt=self.attempt, action=action, kind=kind,
                       ts=now, nodes=nodes, ranks=ranks, rule=rule, category=category,
                       message=message, evidence=evidence, budgets=budgets, rules_version=rv)
        return st, [dec]

    # ---- persistence (Faust tables store plain dicts) -----------------------------------

    def to_dict(self) -> dict[str, Any]:
        return {
            "job": self.job, "attempt": self.attempt, "phase": self.phase,
            "nodes": {k: dataclasses.asdict(v) for k, v in self.nodes.items()},
            "hits": [{"node": h.node, "m": dataclasses.asdict(h.match)} for h in self.hits],
            "rank_last_ts": {str(k): v for k, v in self.rank_last_ts.items()},
            "tail": [[t.rank, t.ts, t.text] for t in self.tail],
            "failure_seen_at": self.failure_seen_at, "restarts_used": self.restarts_used,
            "same_error": dict(self.same_error), "decided": list(self.decided),
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> JobState:
        job, attempt = d["job"], int(d["attempt"])
        hits = []
        for h in d.get("hits", []):
            m = dict(h["m"])
            m["context"] = tuple(m.get("context") or ())
            hits.append(Hit(job=job, attempt=attempt, node=h["node"], match=Match(**m)))
        return cls(job=job, attempt=attempt, phase=d["phase"],
                   nodes={k: NodeState(**v) for k, v in d.get("nodes", {}).items()},
                   hits=tuple(hits),
                   rank_last_ts={int(k): float(v) for k, v in d.get("rank_last_ts", {}).items()},
                   tail=tuple(TailLine(r, float(ts), txt) for r, ts, txt in d.get("tail", [])),
                   failure_seen_at=d.get("failure_seen_at"),
                   restarts_used=int(d.get("restarts_used", 0)),
                   same_error={k: int(v) for k, v in d.get("same_error", {}).items()},
                   decided=tuple(d.get("decided", ())))
