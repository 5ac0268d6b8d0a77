"""A job's state as plain immutable data and its persistence (core/folds.py folds into it)."""

from __future__ import annotations

import dataclasses
import operator
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from faultwatch.core.events import (
    Hit,
    Match,
    TailLine,
)
from faultwatch.core.ledger import Ledger
from faultwatch.core.pmap import EMPTY, PMap, empty
from faultwatch.core.policy import Policy
from faultwatch.core.progress import RankProg
from faultwatch.core.windows import (
    WARMUP_OUTPUTS,
    WARMUP_STEPS,
    GapHist,
    OpenStage,
)

__all__ = ["DECIDED", "DONE", "RUNNING", "SETTLING", "JobState", "NodeState", "Phase", "Spare"]

MAX_HITS = 64  # hits kept per attempt (the earliest ones: the root is among them)
MAX_TAIL = 16  # recent lines kept per job as silence evidence (~2 kB of the state)
MAX_DECIDED = 64  # decision ids remembered for dedupe
MAX_PENDING_GAPS = 32  # output gaps held until the next step advance (then samples)
MAX_NOTIFY = 100  # notify decisions per attempt (a chatty job cannot flood the topic)


class Phase(StrEnum):
    """Where a job's current attempt is: a `str`, so it compares and serialises as one."""

    RUNNING = "running"
    SETTLING = "settling"  # a failure was seen; waiting until every root error is in
    DECIDED = "decided"  # a decision about this attempt was published
    DONE = "done"  # every node exited 0


RUNNING, SETTLING, DECIDED, DONE = Phase.RUNNING, Phase.SETTLING, Phase.DECIDED, Phase.DONE


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
    # seconds from started_ts its launcher may take to assemble the job (core/start.py);
    # held until one of the node's ranks prints (`ranked`)
    start_hold_s: float | None = None
    ranked: bool = False  # a line of this node carried a rank (not only its launcher's)


@dataclass(frozen=True, slots=True)
class Spare:
    """A node of the run's allocation waiting, without the training command, to replace a
    bad one (core/spares.py): what its own notes say and what the processor stamped on them."""

    node: str
    since: float  # agent time of its first note (registration)
    last_ts: float  # agent time of its latest note
    seen_at: float  # processor time of its latest note (a spare that dies is noticed)
    checks: str = "off"  # its boot checks: passed | failed | running | off
    failed: tuple[str, ...] = ()  # the names of the checks that failed
    registry: str = "healthy"  # the node registry's state of it at its latest note (gate)
    busy: str = ""  # another job's spare took this node (the agent's node lock says)
    state: str = "waiting"  # waiting | taken | lost | declined
    taken_for: str = ""  # the node it replaces (taken)
    taken_attempt: int = -1  # the attempt whose decision took it


_SPARE_FIELDS = tuple(f.name for f in dataclasses.fields(Spare))
_NODE_FIELDS = tuple(f.name for f in dataclasses.fields(NodeState))
_NODE_FIELD_SET = frozenset(_NODE_FIELDS)
_NODE_INDEX = {f: i for i, f in enumerate(_NODE_FIELDS)}
_NODE_GET = operator.attrgetter(*_NODE_FIELDS)  # every field's value, in one call
_NODE_SET = tuple(NodeState.__dict__[f].__set__ for f in _NODE_FIELDS)  # the slots' setters


@dataclass(frozen=True)
class JobState:
    """One job's state; every transition returns a new value (folds here, detectors in
    failure/silence/notices, dispatch in job.py).

    Attempt-scoped fields reset on a new attempt; budgets, learned windows, blacklists,
    suspects and dedupe ids live across attempts.
    """

    job: str
    attempt: int = 0
    phase: Phase = Phase.RUNNING
    nodes: PMap[str, NodeState] = field(default_factory=empty)
    hits: tuple[Hit, ...] = ()
    rank_last_ts: PMap[int, float] = field(default_factory=empty)
    tail: tuple[TailLine, ...] = ()
    failure_seen_at: float | None = None  # processor time the failure was seen (fallback)
    failure_ts: float | None = None  # event time of the first failure (settle horizon)
    restarts_used: int = 0
    same_error: PMap[str, int] = field(default_factory=empty)
    decided: tuple[str, ...] = ()
    # attempt-scoped
    expected_world: int | None = None
    expected_nodes: int | None = None
    last_output_ts: float | None = None
    outputs: int = 0
    stages: PMap[int, OpenStage] = field(default_factory=empty)
    progress: PMap[int, RankProg] = field(default_factory=empty)
    step_ts: float | None = None
    steps: int = 0
    outputs_since_step: int = 0  # output batches since the last step advance (stall: flowing)
    # gaps waiting for the job to advance again (then samples): output gaps since the last
    # advance, and the step gap of the last advance itself (weight in the key: "@steps:k").
    # A stalled bar redrawn once by tqdm's monitor thread may even show one more step than
    # was drawn: the gap it ends is never confirmed by a further advance.
    pending_gaps: tuple[tuple[str, float, float], ...] = ()
    slow_check_ts: float | None = None
    stage_ts: float | None = None  # latest stage open/close (gaps spanning it are no samples)
    flags: frozenset[str] = frozenset()  # one-shot notes of this attempt (skew, slow:r, boot:n)
    notified: int = 0
    diagnoses: PMap[str, Any] = field(default_factory=empty)  # node -> answer (diagnosis.py)
    diag_for: float | None = None  # the hang deadline the last `diagnose` request was for
    diag_asked: float | None = None  # event time of that request
    # the requests of this attempt (id, event time, deadline it was for), the last 16: the
    # hang decision's evidence names them (the probes themselves go on the control topic)
    diag_sent: tuple[tuple[str, float, float], ...] = ()
    losses: tuple[float, ...] = ()  # recent finite training losses (core/divergence.py)
    # across attempts
    hang_culprits: PMap[str, int] = field(default_factory=empty)  # node -> hangs it caused
    hists: PMap[str, GapHist] = field(default_factory=empty)
    retryable: tuple[str, ...] = ()
    blacklist: PMap[str, tuple[int, float]] = field(default_factory=empty)
    short_fails: PMap[str, int] = field(default_factory=empty)
    slow_nodes: PMap[str, int] = field(default_factory=empty)
    restart_times: tuple[float, ...] = ()
    # the run (core/runs.py): the state is of the job's current run only
    run_id: str = ""  # the run's identity (its first run-start's); "" before any
    run_source: str = ""  # where the agent took it from: flag, slurm, torchrun, ...
    scheduler: PMap[str, Any] = field(default_factory=empty)  # frozen (see freeze)
    run_ids: frozenset[str] = frozenset()  # run ids of this run (generated ones that joined)
    retired: tuple[str, ...] = ()  # earlier runs of this job name, newest last (bounded)
    dropped: PMap[str, int] = field(default_factory=empty)  # records refused, by reason
    failed: bool = False  # this attempt was decided `fail` (the run is over)
    # the nodes the scheduler says the run holds (core/membership.py); None: not asked
    allocation: frozenset[str] | None = None
    run_gen: int = 0  # runs before this one that had its run id (a derived id reused)
    # hot spares of the run (core/spares.py), and the active nodes that host the launch's
    # rendezvous endpoint (a swap cannot replace those)
    spares: PMap[str, Spare] = field(default_factory=empty)
    rdzv_hosts: frozenset[str] = frozenset()
    # the run's ledger (core/ledger.py, folded by core/timeline.py): attempts, incidents and
    # progress in event time, for goodput; a new run starts a new one
    ledger: Ledger = field(default_factory=Ledger)

    # ---- queries (evidence) -------------------------------------------------------------

    @property
    def warmed_up(self) -> bool:
        return self.steps >= WARMUP_STEPS or (self.steps == 0 and self.outputs >= WARMUP_OUTPUTS)

    def open_stages(self) -> list[OpenStage]:
        return list(self.stages.values())

    def node(self, node: str, ts: float) -> NodeState:
        """The node's state, or a fresh one started at `ts`."""
        ns: NodeState | None = self.nodes.get(node)
        return ns or NodeState(node=node, started_ts=ts)

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

    def latest_event_ts(self) -> float | None:
        """The event time of the newest evidence this attempt holds: a node's start, output,
        heartbeat or exit, or a hit (the agents' clocks; None before any)."""
        best: float | None = None
        for n in self.nodes.values():
            for t in (n.started_ts, n.last_output_ts, n.last_hb_ts, n.exit_ts):
                if t is not None and (best is None or t > best):
                    best = t
        for h in self.hits:
            if best is None or h.match.ts > best:
                best = h.match.ts
        return best

    def shown_nothing(self) -> bool:
        """Nothing but run-starts so far: no output, heartbeat, hit or exit. The cheapest
        job to forget when the table is full (a phantom stays like this; a real job leaves
        it with its first heartbeat, seconds after it starts)."""
        if self.outputs or self.hits or self.phase != Phase.RUNNING:
            return False
        return all(n.last_hb_ts is None and n.exit_ts is None and n.last_output_ts is None
                   for n in self.nodes.values())

    def blacklist_candidates(self, policy: Policy, extra: tuple[str, ...] = ()) -> list[str]:
        """Nodes to avoid at the next restart: suspects of short failed attempts, nodes slow
        in two attempts, failed boot checks, lost nodes."""
        c = set(extra)
        c.update(n for n, k in self.short_fails.items() if k >= policy.suspect_after)
        c.update(n for n, k in self.slow_nodes.items() if k >= 2)
        c.update(n for n, k in self.hang_culprits.items() if k >= 2)
        c.update(f[5:] for f in self.flags if f.startswith("boot:"))
        return sorted(c)

    # ---- persistence (Faust tables store plain dicts) -----------------------------------

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON-able data, one entry per field that differs from its default (see
        _CODECS; from_dict fills the others in): a job that showed little is stored small."""
        out: dict[str, Any] = {}
        for name, (enc, _) in _CODECS.items():
            v = getattr(self, name)
            if name in _ALWAYS or v != _DEFAULT_VALUE.get(name, _NO_DEFAULT):
                out[name] = enc(v)
        return out

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> JobState:
        """The inverse of to_dict; a field missing from `d` (an older state) takes its
        default. Unknown keys (`_p`, newer fields) are ignored."""
        kw = {name: dec(d[name], d) for name, (_, dec) in _CODECS.items() if name in d}
        for name, v in kw.items():
            if type(v) is PMap and not v:
                kw[name] = EMPTY  # one shared empty map (pmap.empty)
        return cls(**kw)


def freeze(x: Any) -> Any:
    """A JSON value made immutable: objects become PMaps, lists tuples."""
    if isinstance(x, dict):
        return PMap({str(k): freeze(v) for k, v in x.items()})
    if isinstance(x, list | tuple):
        return tuple(freeze(v) for v in x)
    return x


def thaw(x: Any) -> Any:
    """The plain JSON value of a frozen one (freeze's inverse)."""
    if isinstance(x, PMap):
        return {k: thaw(v) for k, v in x.items()}
    if isinstance(x, tuple):
        return [thaw(v) for v in x]
    return x


# ---- cheap copies ---------------------------------------------------------------------------

def evolve(st: JobState, **changes: Any) -> JobState:
    """`dataclasses.replace(st, **changes)` at a fraction of its cost: JobState has ~45
    fields and no __post_init__, so a copy of its __dict__ is the same value. The folds
    below run once per signal, where replace's keyword building and __init__ were the job
    stage's largest cost."""
    if not _FIELD_SET.issuperset(changes):
        raise TypeError(f"JobState has no field(s) {sorted(set(changes) - _FIELD_SET)}")
    new = object.__new__(JobState)
    d = new.__dict__
    d.update(st.__dict__)
    d.update(changes)
    return new


def node_with(ns: NodeState, **changes: Any) -> NodeState:
    """`dataclasses.replace` for a NodeState (slots: copied field by field, no __init__)."""
    if not _NODE_FIELD_SET.issuperset(changes):
        raise TypeError(f"NodeState has no field(s) {sorted(set(changes) - _NODE_FIELD_SET)}")
    vals = list(_NODE_GET(ns))
    for f, v in changes.items():
        vals[_NODE_INDEX[f]] = v
    new = object.__new__(NodeState)
    for set_slot, v in zip(_NODE_SET, vals, strict=True):
        set_slot(new, v)
    return new


Enc = Callable[[Any], Any]
Dec = Callable[[Any, Mapping[str, Any]], Any]


def _same(x: Any) -> Any:
    return x


def _d(conv: Callable[[Any], Any]) -> Dec:
    return lambda x, _d: conv(x)


def _opt(conv: Callable[[Any], Any]) -> Dec:
    return lambda x, _d: None if x is None else conv(x)


def _str_map(conv: Callable[[Any], Any]) -> tuple[Enc, Dec]:
    return (lambda m: {k: v for k, v in m.items()},
            lambda x, _d: PMap({str(k): conv(v) for k, v in x.items()}))


def _match_of(m: Mapping[str, Any]) -> Match:
    return Match(**{**m, "context": tuple(m.get("context") or ())})


def _dec_nodes(x: Any, _d: Mapping[str, Any]) -> PMap[str, NodeState]:
    return PMap({k: NodeState(**v) if isinstance(v, dict) else NodeState(*v)
                 for k, v in x.items()})


def _spare_of(v: Any) -> Spare:
    vals = list(v)
    vals[5] = tuple(vals[5])  # failed check names
    return Spare(*vals)


def _dec_hits(x: Any, d: Mapping[str, Any]) -> tuple[Hit, ...]:
    job, attempt = str(d["job"]), int(d["attempt"])
    return tuple(Hit(job, attempt, h["node"], _match_of(h["m"]), h.get("run_id", ""))
                 for h in x)


def _dec_rank_last(x: Any, _d: Mapping[str, Any]) -> PMap[int, float]:
    rows = x.items() if isinstance(x, dict) else x
    return PMap({int(k): float(v) for k, v in rows})


def _enc_blacklist(m: PMap[str, tuple[int, float]]) -> dict[str, list[Any]]:
    return {k: list(v) for k, v in m.items()}


def _dec_blacklist(x: Any, _d: Mapping[str, Any]) -> PMap[str, tuple[int, float]]:
    return PMap({str(k): (int(v[0]), float(v[1])) for k, v in x.items()})


_CODECS: dict[str, tuple[Enc, Dec]] = {
    "job": (_same, _d(str)),
    "attempt": (_same, _d(int)),
    "phase": (str, _d(Phase)),
    "nodes": (lambda m: {k: list(_NODE_GET(v)) for k, v in m.items()}, _dec_nodes),
    "hits": (lambda hs: [{"node": h.node, "m": dataclasses.asdict(h.match), "run_id": h.run_id}
                         for h in hs], _dec_hits),
    "rank_last_ts": (lambda m: list(map(list, m.items())), _dec_rank_last),
    "tail": (lambda ts: list(map(list, ts)),
             _d(lambda x: tuple(TailLine(r, float(ts), txt) for r, ts, txt in x))),
    "failure_seen_at": (_same, _opt(float)),
    "failure_ts": (_same, _opt(float)),
    "restarts_used": (_same, _d(int)),
    "same_error": _str_map(int),
    "decided": (list, _d(tuple)),
    "expected_world": (_same, _opt(int)),
    "expected_nodes": (_same, _opt(int)),
    "last_output_ts": (_same, _opt(float)),
    "outputs": (_same, _d(int)),
    "stages": (lambda m: [[k, s.stage, s.window_s, s.since] for k, s in m.items()],
               _d(lambda x: PMap({int(k): OpenStage(s, w, float(t)) for k, s, w, t in x}))),
    "progress": (lambda m: [[k, *p] for k, p in m.items()],  # (a RankProg is its to_list)
                 _d(lambda x: PMap({int(r[0]): RankProg.from_list(r[1:]) for r in x}))),
    "step_ts": (_same, _opt(float)),
    "steps": (_same, _d(int)),
    "outputs_since_step": (_same, _d(int)),
    "pending_gaps": (lambda g: [list(x) for x in g],
                     _d(lambda x: tuple((str(k), float(v), float(e)) for k, v, e in x))),
    "slow_check_ts": (_same, _opt(float)),
    "stage_ts": (_same, _opt(float)),
    "flags": (sorted, _d(frozenset)),
    "notified": (_same, _d(int)),
    "diagnoses": (lambda m: thaw(m), _d(lambda x: freeze(dict(x)))),
    "diag_for": (_same, _opt(float)),
    "diag_asked": (_same, _opt(float)),
    "diag_sent": (lambda g: [list(x) for x in g],
                  _d(lambda x: tuple((str(i), float(a), float(f)) for i, a, f in x))),
    "hang_culprits": _str_map(int),
    "hists": (lambda m: {k: h.to_list() for k, h in m.items()},
              _d(lambda x: PMap({str(k): GapHist.from_list(v) for k, v in x.items()}))),
    "retryable": (list, _d(lambda x: tuple(str(p) for p in x))),
    "blacklist": (_enc_blacklist, _dec_blacklist),
    "short_fails": _str_map(int),
    "slow_nodes": _str_map(int),
    "restart_times": (list, _d(lambda x: tuple(float(t) for t in x))),
    "run_id": (_same, _d(str)),
    "run_source": (_same, _d(str)),
    "scheduler": (lambda m: thaw(m), _d(lambda x: freeze(dict(x)))),
    "run_ids": (sorted, _d(lambda x: frozenset(str(r) for r in x))),
    "retired": (list, _d(lambda x: tuple(str(r) for r in x))),
    "dropped": _str_map(int),
    "failed": (_same, _d(bool)),
    "allocation": (lambda a: None if a is None else sorted(a),
                   _opt(lambda x: frozenset(str(n) for n in x))),
    "run_gen": (_same, _d(int)),
    "losses": (list, _d(lambda x: tuple(float(v) for v in x))),
    "spares": (lambda m: {k: [getattr(v, f) for f in _SPARE_FIELDS] for k, v in m.items()},
               _d(lambda x: PMap({str(k): _spare_of(v) for k, v in x.items()}))),
    "rdzv_hosts": (sorted, _d(lambda x: frozenset(str(n) for n in x))),
    "ledger": (lambda led: led.to_dict() if led.attempts else None,
               _d(lambda x: Ledger() if x is None else Ledger.from_dict(x))),
}

# attempt-scoped fields: reset to their defaults by new_attempt (see JobState's doc)
_ATTEMPT_SCOPED = ("nodes", "hits", "rank_last_ts", "tail", "failure_seen_at", "failure_ts",
                   "expected_world", "expected_nodes", "last_output_ts", "outputs", "stages",
                   "progress", "step_ts", "steps", "outputs_since_step", "pending_gaps",
                   "slow_check_ts", "stage_ts", "flags", "notified", "failed", "diagnoses",
                   "diag_for", "diag_asked", "diag_sent", "losses")


def _defaults() -> dict[str, Any]:
    out: dict[str, Any] = {}
    for f in dataclasses.fields(JobState):
        if f.name in _ATTEMPT_SCOPED:
            out[f.name] = f.default_factory() if f.default_factory is not dataclasses.MISSING \
                else f.default
    return out


ATTEMPT_RESET = _defaults()
_FIELD_SET = frozenset(f.name for f in dataclasses.fields(JobState))
_NO_DEFAULT = object()
_DEFAULT_VALUE: dict[str, Any] = {
    f.name: f.default_factory() if f.default_factory is not dataclasses.MISSING else f.default
    for f in dataclasses.fields(JobState)
    if f.default_factory is not dataclasses.MISSING or f.default is not dataclasses.MISSING}
_ALWAYS = frozenset({"job", "attempt", "phase"})  # what readers of the raw table look at

_missing = {f.name for f in dataclasses.fields(JobState)} ^ set(_CODECS)
if _missing:  # a field added without a codec (or a codec for a removed field)
    raise AssertionError(f"JobState fields and _CODECS differ: {sorted(_missing)}")
