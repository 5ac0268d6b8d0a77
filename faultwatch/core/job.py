"""The per-job state machine: signals in, decisions out, time passed in, no I/O.

Detectors live beside it: windows.py (fixed, stage and adaptive silence windows),
progress.py (step advances, slow ranks), decide.py (budget, storm guard, blacklists),
silence.py (hang, exit hang, progress stall, node lost), failure.py (errors and exits),
notices.py (SDK/agent notes, start skew).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

from faultwatch.core.decide import decision_id, guard_restart
from faultwatch.core.events import (
    Decision,
    Exit,
    Heartbeat,
    Hit,
    Match,
    Notice,
    Output,
    Progress,
    RunStart,
    Signal,
    Stage,
    TailLine,
)
from faultwatch.core.pmap import PMap
from faultwatch.core.policy import Policy
from faultwatch.core.progress import RankProg, fold_step
from faultwatch.core.windows import (
    DEFAULT_STAGE,
    WARMUP_OUTPUTS,
    WARMUP_STEPS,
    GapHist,
    OpenStage,
)

__all__ = ["DECIDED", "DONE", "RUNNING", "SETTLING", "JobState", "NodeState", "decision_id"]

MAX_HITS = 64  # hits kept per attempt (the earliest ones: the root is among them)
MAX_TAIL = 16  # recent lines kept per job as silence evidence (~2 kB of the state)
MAX_CONTEXT = 40  # traceback lines carried in a decision's evidence
MAX_DECIDED = 64  # decision ids remembered for dedupe
MAX_NOTIFY = 100  # notify decisions per attempt (a chatty job cannot flood the topic)
STEPS_HIST = "@steps"  # histogram key of the gaps between progress steps

RUNNING, SETTLING, DECIDED, DONE = "running", "settling", "decided", "done"


@dataclass(frozen=True, slots=True)
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
    seen_at: float | None = None  # processor time of the node's latest record (node lost)


_NODE_FIELDS = tuple(f.name for f in dataclasses.fields(NodeState))


@dataclass(frozen=True)
class JobState:
    """One job's state; every transition returns a new value.

    Attempt-scoped fields reset on a new attempt; budgets, learned windows, blacklists,
    suspects and dedupe ids live across attempts.
    """

    job: str
    attempt: int = 0
    phase: str = RUNNING
    nodes: PMap[str, NodeState] = field(default_factory=PMap)
    hits: tuple[Hit, ...] = ()
    rank_last_ts: PMap[int, float] = field(default_factory=PMap)
    tail: tuple[TailLine, ...] = ()
    failure_seen_at: float | None = None  # processor time the failure was seen (fallback)
    failure_ts: float | None = None  # event time of the first failure (settle horizon)
    restarts_used: int = 0
    same_error: dict[str, int] = field(default_factory=dict)
    decided: tuple[str, ...] = ()
    # attempt-scoped
    expected_world: int | None = None
    expected_nodes: int | None = None
    last_output_ts: float | None = None
    outputs: int = 0
    stages: PMap[int, OpenStage] = field(default_factory=PMap)
    progress: PMap[int, RankProg] = field(default_factory=PMap)
    step_ts: float | None = None
    steps: int = 0
    slow_check_ts: float | None = None
    stage_ts: float | None = None  # latest stage open/close (gaps spanning it are no samples)
    flags: frozenset[str] = frozenset()  # one-shot notes of this attempt (skew, slow:r, boot:n)
    notified: int = 0
    # across attempts
    hists: dict[str, GapHist] = field(default_factory=dict)
    retryable: tuple[str, ...] = ()
    blacklist: dict[str, tuple[int, float]] = field(default_factory=dict)
    short_fails: dict[str, int] = field(default_factory=dict)
    slow_nodes: dict[str, int] = field(default_factory=dict)
    restart_times: tuple[float, ...] = ()

    # ---- transitions -------------------------------------------------------------------

    def apply(self, sig: Signal, now: float, policy: Policy,
              rules_version: str = "") -> tuple[JobState, list[Decision]]:
        """Fold one signal into the state; may decide from its evidence (event time)."""
        from faultwatch.core import failure, notices, silence

        if sig.attempt < self.attempt:
            return self, []  # a late record of an attempt that was already replaced
        st = self
        if sig.attempt > self.attempt:
            st = st._new_attempt(sig.attempt)
        if isinstance(sig, Output):
            return st._on_output(sig, now), []
        if isinstance(sig, Heartbeat):
            st = st._on_heartbeat(sig, now)
            if st.phase == SETTLING:
                return failure.settle(st, now, policy, rules_version)
            return silence.check(st, policy, rules_version)
        if isinstance(sig, Progress):
            return notices.on_progress(st._on_progress(sig), sig, policy, rules_version)
        if isinstance(sig, Hit):
            return failure.on_hit(st, sig, now), []
        if isinstance(sig, RunStart):
            return notices.on_start(st._on_start(sig, now), sig, policy, rules_version)
        if isinstance(sig, Exit):
            st = st._on_exit(sig, now)
            if st.phase == RUNNING:
                return silence.check(st, policy, rules_version)
            if st.phase == SETTLING:
                return failure.settle(st, now, policy, rules_version)
            return st, []
        if isinstance(sig, Stage):
            return st._on_stage(sig), []
        if isinstance(sig, Notice):
            return notices.on_notice(st, sig, policy, rules_version)
        return st, []

    def tick(self, now: float, policy: Policy, rules_version: str = "", *,
             live_clock: bool = False, caught_up: bool = True
             ) -> tuple[JobState, list[Decision]]:
        """Advance processor time: the settle fallback when the shell says it is caught up
        (failure.settle), and node-lost checks when the shell says its clock may be trusted
        (caught up, past the grace after assignment/recovery)."""
        from faultwatch.core import failure, silence

        if self.phase == SETTLING:
            return failure.settle(self, now, policy, rules_version, caught_up=caught_up,
                                  timer=True)
        if live_clock and self.phase == RUNNING and policy.node_lost_detection:
            return silence.check_lost(self, now, policy, rules_version)
        return self, []

    @property
    def warmed_up(self) -> bool:
        return self.steps >= WARMUP_STEPS or (self.steps == 0 and self.outputs >= WARMUP_OUTPUTS)

    def open_stages(self) -> list[OpenStage]:
        return list(self.stages.values())

    # ---- folding -----------------------------------------------------------------------

    def _new_attempt(self, attempt: int) -> JobState:
        return dataclasses.replace(
            self, attempt=attempt, phase=RUNNING, nodes=PMap(), hits=(), rank_last_ts=PMap(),
            tail=(), failure_seen_at=None, failure_ts=None, expected_world=None,
            expected_nodes=None, last_output_ts=None, outputs=0, stages=PMap(), progress=PMap(),
            step_ts=None, steps=0, slow_check_ts=None, stage_ts=None, flags=frozenset(), notified=0)

    def _on_start(self, ev: RunStart, now: float) -> JobState:
        ns = NodeState(node=ev.node, started_ts=ev.ts, run_id=ev.run_id,
                       world_size=ev.world_size, rank=ev.rank, seen_at=now)
        phase = RUNNING if self.phase == DONE else self.phase
        world = max(self.expected_world or 0, ev.world_size or 0) or None
        nn = max(self.expected_nodes or 0, ev.nnodes or 0) or None
        return dataclasses.replace(self, nodes=self.nodes.set(ev.node, ns), phase=phase,
                                   expected_world=world, expected_nodes=nn)

    def node(self, node: str, ts: float) -> NodeState:
        ns: NodeState | None = self.nodes.get(node)
        return ns or NodeState(node=node, started_ts=ts)

    def _on_output(self, ev: Output, now: float) -> JobState:
        ns = self.node(ev.node, ev.ts)
        last = max(ns.last_output_ts or ev.ts, ev.ts)
        ranks = self.rank_last_ts
        for rank, ts in ev.rank_last_ts:
            key = -1 if rank is None else rank
            old = ranks.get(key)
            if old is None or ts > old:
                ranks = ranks.set(key, ts)
        tail = (self.tail + ev.tail)[-MAX_TAIL:] if ev.tail else self.tail
        hists = self.hists
        prev = self.last_output_ts
        if prev is not None and ev.ts > prev and self.warmed_up \
                and (self.stage_ts is None or self.stage_ts < prev):
            skey = self._stage_key()
            if skey is not None:
                hist = hists.get(skey, GapHist())
                new = hist.add(ev.ts - prev)
                if new is not hist:
                    hists = {**hists, skey: new}
        job_last = ev.ts if prev is None else max(prev, ev.ts)
        return dataclasses.replace(
            self, nodes=self.nodes.set(ev.node, dataclasses.replace(
                ns, last_output_ts=last, seen_at=now)),
            rank_last_ts=ranks, tail=tail, last_output_ts=job_last, outputs=self.outputs + 1,
            hists=hists)

    def _stage_key(self) -> str | None:
        """The histogram a gap belongs to: the default stage, or the single open stage."""
        if not self.stages:
            return DEFAULT_STAGE
        names = {s.stage for s in self.stages.values()}
        return names.pop() if len(names) == 1 else None

    def _on_heartbeat(self, ev: Heartbeat, now: float) -> JobState:
        ns = self.node(ev.node, ev.started_ts or ev.ts)
        last = ns.last_output_ts
        if ev.last_output_ts is not None:
            last = max(last or ev.last_output_ts, ev.last_output_ts)
        alive = ev.alive and ns.exit_ts is None
        ns = dataclasses.replace(ns, last_output_ts=last, last_hb_ts=ev.ts, alive=alive,
                                 seen_at=now)
        return dataclasses.replace(self, nodes=self.nodes.set(ev.node, ns))

    def _on_exit(self, ev: Exit, now: float) -> JobState:
        ns = dataclasses.replace(self.node(ev.node, ev.ts), alive=False, exit_code=ev.exit_code,
                                 signal=ev.signal, exit_ts=ev.ts, seen_at=now)
        st = dataclasses.replace(self, nodes=self.nodes.set(ev.node, ns))
        if st.phase == SETTLING and ev.exit_code != 0 and st.failure_ts is not None \
                and ev.ts < st.failure_ts:
            return dataclasses.replace(st, failure_ts=ev.ts)  # an earlier failure, seen later
        if st.phase != RUNNING:
            return st
        if ev.exit_code != 0:
            return dataclasses.replace(st, phase=SETTLING, failure_seen_at=now, failure_ts=ev.ts)
        if all(not n.alive and n.exit_code == 0 for n in st.nodes.values()):
            return dataclasses.replace(st, phase=DONE)
        return st

    def _on_progress(self, ev: Progress) -> JobState:
        key = -1 if ev.rank is None else ev.rank
        prev: RankProg | None = self.progress.get(key)
        rp, advanced = fold_step(prev, ev.step, ev.ts, ev.step_time_s, ev.node)
        st = dataclasses.replace(self, progress=self.progress.set(key, rp))
        if advanced:
            hists = st.hists
            if st.step_ts is not None and ev.ts > st.step_ts and st.steps >= WARMUP_STEPS \
                    and not st.stages:
                hist = hists.get(STEPS_HIST, GapHist())
                hists = {**hists, STEPS_HIST: hist.add(ev.ts - st.step_ts)}
            step_ts = ev.ts if st.step_ts is None else max(st.step_ts, ev.ts)
            st = dataclasses.replace(st, step_ts=step_ts, steps=st.steps + 1, hists=hists)
        elif prev is None and st.step_ts is None:
            st = dataclasses.replace(st, step_ts=ev.ts)
        return st

    def _on_stage(self, ev: Stage) -> JobState:
        key = -1 if ev.rank is None else ev.rank
        if ev.opens:
            return dataclasses.replace(self, stages=self.stages.set(
                key, OpenStage(ev.stage, ev.hang_window_s, ev.ts)), stage_ts=ev.ts)
        cur: OpenStage | None = self.stages.get(key)
        if cur is None or cur.stage != ev.stage:
            return self
        # the step clock restarts when a stage ends (a long checkpoint is no stall)
        step_ts = None if self.step_ts is None else max(self.step_ts, ev.ts)
        return dataclasses.replace(self, stages=self.stages.remove(key), step_ts=step_ts,
                                   stage_ts=ev.ts)

    # ---- evidence helpers --------------------------------------------------------------

    def quiet_first(self) -> int | None:
        """The rank that went quiet first: a rank that never printed while others did, else
        the rank whose last output is strictly the oldest."""
        missing = self.never_printed(1)
        if missing:
            return missing[0]
        ranked = sorted((ts, r) for r, ts in self.rank_last_ts.items() if r >= 0)
        if len(ranked) < 2:
            return None
        return ranked[0][1] if ranked[0][0] < ranked[1][0] else None

    def never_printed(self, limit: int = 32) -> list[int]:
        """Expected ranks (from the run-start world size) with no output this attempt, when
        rank prefixes show which ranks printed at all."""
        if not self.expected_world or not any(r >= 0 for r in self.rank_last_ts):
            return []
        out = []
        for r in range(self.expected_world):
            if r not in self.rank_last_ts:
                out.append(r)
                if len(out) >= limit:
                    break
        return out

    def expected_evidence(self) -> dict[str, Any]:
        seen = sum(1 for r in self.rank_last_ts if r >= 0)
        ev: dict[str, Any] = {"world_size": self.expected_world, "nnodes": self.expected_nodes,
                              "nodes_started": len(self.nodes), "ranks_printed": seen}
        missing = self.never_printed()
        if missing:
            ev["ranks_never_printed"] = missing
        if self.expected_nodes and len(self.nodes) < self.expected_nodes:
            ev["nodes_missing"] = self.expected_nodes - len(self.nodes)
        return ev

    def last_lines_per_rank(self, per_rank: int = 3) -> dict[str, list[str]]:
        out: dict[str, list[str]] = {}
        for t in reversed(self.tail):
            key = "?" if t.rank is None else str(t.rank)
            lines = out.setdefault(key, [])
            if len(lines) < per_rank:
                lines.insert(0, t.text)
        return out

    def blacklist_candidates(self, policy: Policy, extra: tuple[str, ...] = ()) -> list[str]:
        """Nodes to avoid at the next restart: suspects of short failed attempts, nodes slow
        in two attempts, failed boot checks, lost nodes."""
        c = set(extra)
        c.update(n for n, k in self.short_fails.items() if k >= policy.suspect_after)
        c.update(n for n, k in self.slow_nodes.items() if k >= 2)
        c.update(f[5:] for f in self.flags if f.startswith("boot:"))
        return sorted(c)

    # ---- deciding ----------------------------------------------------------------------

    def emit(self, kind: str, episode: str, action: str, now: float, policy: Policy, rv: str,
             *, nodes: tuple[str, ...], ranks: tuple[int, ...], rule: str | None,
             category: str | None, message: str, evidence: dict[str, Any],
             candidates: tuple[str, ...] = ()) -> tuple[JobState, list[Decision]]:
        """Budget and storm guard for restarts, then publish once per (attempt, kind, episode).
        `notify` decisions leave the phase alone and cost no budget."""
        from faultwatch.core.decide import blacklist_terms

        did = decision_id(self.job, self.attempt, kind, episode)
        if did in self.decided:
            st = self if action == "notify" else dataclasses.replace(self, phase=DECIDED)
            return st, []
        decided = (self.decided + (did,))[-MAX_DECIDED:]
        if action == "notify":
            if self.notified >= MAX_NOTIFY:
                return self, []
            st = dataclasses.replace(self, decided=decided, notified=self.notified + 1)
            budgets: dict[str, object] = {"restarts_used": self.restarts_used,
                                          "max_restarts": policy.max_restarts}
            return st, [Decision(id=did, job=self.job, attempt=self.attempt, action=action,
                                 kind=kind, ts=now, nodes=nodes, ranks=ranks, rule=rule,
                                 category=category, message=message, evidence=evidence,
                                 budgets=budgets, rules_version=rv)]
        g = guard_restart(action, message, now, policy, self.restarts_used, self.restart_times)
        evidence = {**evidence, **g.evidence}
        blacklist = self.blacklist
        if g.action == "blacklist":
            blacklist, terms = blacklist_terms(nodes, now, policy, self.blacklist)
            evidence["blacklist"] = terms
        if g.action in ("restart", "blacklist"):
            cands = self.blacklist_candidates(policy, candidates)
            if cands:
                evidence["blacklist_candidates"] = cands
        st = dataclasses.replace(self, phase=DECIDED, decided=decided,
                                 restarts_used=g.restarts_used, restart_times=g.restart_times,
                                 blacklist=blacklist)
        budgets = {"restarts_used": st.restarts_used, "max_restarts": policy.max_restarts,
                   "max_same_error": policy.max_same_error,
                   "storm_max_restarts": policy.storm_max_restarts,
                   "storm_window_s": policy.storm_window_s}
        dec = Decision(id=did, job=self.job, attempt=self.attempt, action=g.action, kind=kind,
                       ts=now, nodes=nodes, ranks=ranks, rule=rule, category=category,
                       message=g.message, evidence=evidence, budgets=budgets, rules_version=rv)
        return st, [dec]

    # ---- persistence (Faust tables store plain dicts) -----------------------------------

    def to_dict(self) -> dict[str, Any]:
        return {
            "job": self.job, "attempt": self.attempt, "phase": self.phase,
            "nodes": {k: [getattr(v, f) for f in _NODE_FIELDS] for k, v in self.nodes.items()},
            "hits": [{"node": h.node, "m": dataclasses.asdict(h.match)} for h in self.hits],
            "rank_last_ts": [[k, v] for k, v in self.rank_last_ts.items()],
            "tail": [[t.rank, t.ts, t.text] for t in self.tail],
            "failure_seen_at": self.failure_seen_at, "failure_ts": self.failure_ts,
            "restarts_used": self.restarts_used,
            "same_error": dict(self.same_error), "decided": list(self.decided),
            "expected_world": self.expected_world, "expected_nodes": self.expected_nodes,
            "last_output_ts": self.last_output_ts, "outputs": self.outputs,
            "stages": [[k, s.stage, s.window_s, s.since] for k, s in self.stages.items()],
            "progress": [[k, *p.to_list()] for k, p in self.progress.items()],
            "step_ts": self.step_ts, "steps": self.steps, "slow_check_ts": self.slow_check_ts,
            "stage_ts": self.stage_ts,
            "flags": sorted(self.flags), "notified": self.notified,
            "hists": {k: h.to_list() for k, h in self.hists.items()},
            "retryable": list(self.retryable),
            "blacklist": {k: list(v) for k, v in self.blacklist.items()},
            "short_fails": dict(self.short_fails), "slow_nodes": dict(self.slow_nodes),
            "restart_times": list(self.restart_times),
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> JobState:
        job, attempt = d["job"], int(d["attempt"])
        hits = []
        for h in d.get("hits", []):
            m = dict(h["m"])
            m["context"] = tuple(m.get("context") or ())
            hits.append(Hit(job=job, attempt=attempt, node=h["node"], match=Match(**m)))
        nodes_raw = d.get("nodes", {})
        nodes = {k: NodeState(**v) if isinstance(v, dict) else NodeState(*v)
                 for k, v in nodes_raw.items()}
        rl = d.get("rank_last_ts", [])
        rank_last = {int(k): float(v) for k, v in (rl.items() if isinstance(rl, dict) else rl)}
        return cls(
            job=job, attempt=attempt, phase=d["phase"], nodes=PMap(nodes), hits=tuple(hits),
            rank_last_ts=PMap(rank_last),
            tail=tuple(TailLine(r, float(ts), txt) for r, ts, txt in d.get("tail", [])),
            failure_seen_at=d.get("failure_seen_at"), failure_ts=d.get("failure_ts"),
            restarts_used=int(d.get("restarts_used", 0)),
            same_error={k: int(v) for k, v in d.get("same_error", {}).items()},
            decided=tuple(d.get("decided", ())),
            expected_world=d.get("expected_world"), expected_nodes=d.get("expected_nodes"),
            last_output_ts=d.get("last_output_ts"), outputs=int(d.get("outputs", 0)),
            stages=PMap({int(k): OpenStage(s, w, float(t)) for k, s, w, t in d.get("stages", [])}),
            progress=PMap({int(x[0]): RankProg.from_list(x[1:]) for x in d.get("progress", [])}),
            step_ts=d.get("step_ts"), steps=int(d.get("steps", 0)),
            slow_check_ts=d.get("slow_check_ts"), stage_ts=d.get("stage_ts"),
            flags=frozenset(d.get("flags", ())),
            notified=int(d.get("notified", 0)),
            hists={k: GapHist.from_list(v) for k, v in d.get("hists", {}).items()},
            retryable=tuple(d.get("retryable", ())),
            blacklist={k: (int(v[0]), float(v[1])) for k, v in d.get("blacklist", {}).items()},
            short_fails={k: int(v) for k, v in d.get("short_fails", {}).items()},
            slow_nodes={k: int(v) for k, v in d.get("slow_nodes", {}).items()},
            restart_times=tuple(float(t) for t in d.get("restart_times", ())))
