"""A job run's ledger in event time: its attempts, progress, stages, checkpoints and incidents.

The job stage folds a job's signals and decisions into it (timeline.observe); goodput.py
turns it into time accounts. Everything is bounded: MAX_ATTEMPTS attempts in detail (older ones are
summed into `earlier`), MAX_INCIDENTS incidents, MAX_SAMPLES progress samples, MAX_NODES
node names. A reused job name is a new run, hence a new ledger (core/runs.py).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, NamedTuple

MAX_ATTEMPTS = 16  # attempts kept in detail; older ones are summed into Ledger.earlier
MAX_INCIDENTS = 32  # incidents kept; older ones only counted (Ledger.incidents_dropped)
MAX_SAMPLES = 48  # (ts, step) samples of the run for the step-rate chart, thinned by halves
MAX_NODES = 64  # node names remembered per run (a count beyond)
MAX_SPANS = 16  # closed checkpoint/eval spans kept per attempt (older ones only summed)
MAX_OPEN_RANKS = 1024  # ranks tracked per open stage kind (the union spans the rest anyway)

CHECKPOINT, EVAL = "checkpoint", "eval"
Span = tuple[str, float, float]  # (kind, start, end), event time


def stage_kind(name: str) -> str | None:
    """The account a stage's time goes to: checkpoint (saves and loads), eval, or None
    (other stages are training time)."""
    n = name.lower()
    if n.startswith(("checkpoint", "ckpt", "save")):
        return CHECKPOINT
    if n.startswith(("eval", "valid")):
        return EVAL
    return None


def is_save(name: str) -> bool:
    """A checkpoint stage that writes one (not a load)."""
    return stage_kind(name) == CHECKPOINT and "load" not in name.lower()


class Checkpoint(NamedTuple):
    """The last checkpoint the logs or the SDK showed complete: its step, if known, and when."""

    step: int | None
    ts: float
    attempt: int


class OpenStage(NamedTuple):
    """A stage kind some ranks have open: since when (the union's start), which ranks."""

    kind: str
    since: float
    ranks: frozenset[int]
    step: int | None = None  # the step an opening line named (checkpoint saves)


class Attempt(NamedTuple):
    """One attempt of the run: its launch, progress, stage spans and how it ended."""

    n: int
    launch_ts: float
    node_count: int = 0
    end_ts: float | None = None  # the latest exit seen
    exits: int = 0
    stopped: bool = False  # an operator's (or the scheduler's) signal stopped it
    first_step_ts: float | None = None  # the attempt's first progress mark
    first_step: int | None = None
    last_step_ts: float | None = None  # its latest progress mark
    last_step: int | None = None
    top_step: int | None = None
    open: tuple[OpenStage, ...] = ()
    spans: tuple[Span, ...] = ()  # closed spans, the newest MAX_SPANS
    spans_s: tuple[tuple[str, float], ...] = ()  # seconds of spans dropped from `spans`

    def all_spans(self, until: float) -> list[Span]:
        """Closed spans and open ones cut at `until`."""
        return list(self.spans) + [(o.kind, o.since, until) for o in self.open
                                   if o.since < until]


class Incident(NamedTuple):
    """One failure episode of the run: what ended an attempt, and its timeline (event time).

    `nodes`/`ranks` are the ones the evidence blames (first error, lost node, hang culprit),
    not every node the restart touches. Lost work is the progress between the last
    checkpoint and the failure (`lost_steps` in the job's steps, `lost_s` of training time);
    None when no checkpoint was seen (`lost_known` False)."""

    id: str  # the decision's id ("stop:<attempt>" for an operator's stop)
    attempt: int
    cause: str  # CAUSES (incidents.py)
    kind: str  # the decision's kind ("" for a stop)
    action: str  # restart | blacklist | fail | stop
    rule: str | None
    category: str | None
    nodes: tuple[str, ...]
    ranks: tuple[int, ...]
    first_sign_ts: float  # the first error line or exit, the start of the silence, ...
    detected_ts: float  # the decision
    acted_ts: float | None = None  # the relaunch: the next attempt's first run-start
    recovered_ts: float | None = None  # the first progress after the restart
    last_progress_ts: float | None = None  # before the failure
    last_progress_step: int | None = None
    ckpt_step: int | None = None  # the last checkpoint before the failure
    ckpt_ts: float | None = None
    lost_steps: int | None = None
    lost_s: float | None = None
    lost_known: bool = False
    message: str = ""

    @property
    def restarts(self) -> bool:
        """The run goes on after it (a restart, a blacklist, a stop that is resumed)."""
        return self.action != "fail"

    def to_dict(self) -> dict[str, Any]:
        d = self._asdict()
        d["nodes"], d["ranks"] = list(self.nodes), list(self.ranks)
        return d

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> Incident:
        kw = _typed(d, _INCIDENT_TYPES, cls._fields)
        kw["nodes"] = tuple(str(n) for n in d.get("nodes") or ())
        kw["ranks"] = tuple(int(r) for r in d.get("ranks") or ())
        return cls(**kw)


@dataclass(frozen=True)
class Ledger:
    """A job run's ledger (see the module docstring)."""

    job: str = ""
    run_id: str = ""
    attempts: tuple[Attempt, ...] = ()
    incidents: tuple[Incident, ...] = ()
    ckpt: Checkpoint | None = None
    samples: tuple[tuple[float, int, int], ...] = ()  # (ts, step, attempt)
    stride: int = 1  # samples are kept every `stride` progress marks
    skipped: int = 0  # marks since the last sample
    nodes: tuple[str, ...] = ()
    node_total: int = 0
    first_ts: float | None = None  # the earliest event seen (a launch)
    last_ts: float | None = None  # the latest event seen
    earlier: tuple[tuple[str, float], ...] = ()  # the summed parts of older attempts
    earlier_attempts: int = 0
    incidents_dropped: int = 0
    rev: int = 0  # bumped on every change a reader acts on (publishing)

    def earlier_s(self, part: str) -> float:
        """Seconds of `part` in the attempts summed into `earlier`."""
        return next((v for k, v in self.earlier if k == part), 0.0)

    @property
    def current(self) -> Attempt | None:
        return self.attempts[-1] if self.attempts else None

    def incident_of(self, attempt: int) -> Incident | None:
        return next((i for i in reversed(self.incidents) if i.attempt == attempt), None)

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON-able data; fields at their defaults are left out (a job's state holds
        one ledger, and a fleet's table every job's state)."""
        return _compact({"job": self.job, "run_id": self.run_id,
                         "attempts": [_attempt_out(a) for a in self.attempts],
                         "incidents": [i.to_dict() for i in self.incidents],
                         "ckpt": None if self.ckpt is None else list(self.ckpt),
                         "samples": list(map(list, self.samples)),
                         "stride": self.stride if self.stride != 1 else None,
                         "skipped": self.skipped, "nodes": list(self.nodes),
                         "node_total": self.node_total, "first_ts": self.first_ts,
                         "last_ts": self.last_ts, "earlier": dict(self.earlier),
                         "earlier_attempts": self.earlier_attempts,
                         "incidents_dropped": self.incidents_dropped, "rev": self.rev})

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> Ledger:
        ck = d.get("ckpt")
        return cls(job=str(d.get("job", "")), run_id=str(d.get("run_id", "")),
                   attempts=tuple(_attempt_in(a) for a in d.get("attempts") or ()),
                   incidents=tuple(Incident.from_dict(i) for i in d.get("incidents") or ()),
                   ckpt=None if ck is None else Checkpoint(
                       None if ck[0] is None else int(ck[0]), float(ck[1]), int(ck[2])),
                   samples=tuple((float(t), int(s), int(a)) for t, s, a in
                                 d.get("samples") or ()),
                   stride=int(d.get("stride", 1)), skipped=int(d.get("skipped", 0)),
                   nodes=tuple(str(n) for n in d.get("nodes") or ()),
                   node_total=int(d.get("node_total", 0)),
                   first_ts=_opt_float(d.get("first_ts")), last_ts=_opt_float(d.get("last_ts")),
                   earlier=tuple((str(k), float(v)) for k, v in
                                 (d.get("earlier") or {}).items()),
                   earlier_attempts=int(d.get("earlier_attempts", 0)),
                   incidents_dropped=int(d.get("incidents_dropped", 0)),
                   rev=int(d.get("rev", 0)))


def _default(v: Any) -> bool:
    """None, False, an integer 0 or an empty list/dict (a time of 0.0 is no default)."""
    t = type(v)
    return v is None or v is False or (t is int and v == 0) or ((t is list or t is dict) and not v)


def _compact(d: dict[str, Any]) -> dict[str, Any]:
    """`d` without the entries at a default."""
    return {k: v for k, v in d.items() if not _default(v)}


def _opt_float(x: Any) -> float | None:
    return None if x is None else float(x)


def _attempt_out(a: Attempt) -> dict[str, Any]:
    d = a._asdict()
    d["open"] = [[o.kind, o.since, sorted(o.ranks), o.step] for o in a.open]
    d["spans"] = [list(s) for s in a.spans]
    d["spans_s"] = [list(s) for s in a.spans_s]
    return {k: v for k, v in d.items() if k in ("n", "launch_ts") or not _default(v)}


_ATTEMPT_TYPES: dict[str, Any] = {"n": int, "launch_ts": float, "node_count": int,
                                  "end_ts": float, "exits": int, "stopped": bool,
                                  "first_step_ts": float, "first_step": int,
                                  "last_step_ts": float, "last_step": int, "top_step": int}
_INCIDENT_TYPES: dict[str, Any] = {"id": str, "attempt": int, "cause": str, "kind": str,
                                   "action": str, "first_sign_ts": float,
                                   "detected_ts": float, "acted_ts": float,
                                   "recovered_ts": float, "last_progress_ts": float,
                                   "last_progress_step": int, "ckpt_step": int,
                                   "ckpt_ts": float, "lost_steps": int, "lost_s": float,
                                   "lost_known": bool, "message": str}


def _typed(d: Mapping[str, Any], types: Mapping[str, Any], fields: tuple[str, ...]
           ) -> dict[str, Any]:
    """The fields of `d` known to `fields`, each converted to its type (None kept): a
    TypeError or ValueError names a malformed one."""
    out: dict[str, Any] = {}
    for k in fields:
        if k not in d:
            continue
        v, t = d[k], types.get(k)
        if v is None or t is None:
            out[k] = v
        elif t is bool:
            if not isinstance(v, bool):
                raise TypeError(f"{k} must be true or false, not {v!r}")
            out[k] = v
        elif t is str:
            out[k] = str(v)
        elif isinstance(v, bool) or not isinstance(v, int | float):
            raise TypeError(f"{k} must be a number, not {v!r}")
        else:
            out[k] = t(v)
    return out


def _attempt_in(d: Mapping[str, Any]) -> Attempt:
    kw = _typed(d, _ATTEMPT_TYPES, Attempt._fields)
    kw["open"] = tuple(OpenStage(str(k), float(s), frozenset(int(r) for r in rs),
                                 None if st is None else int(st))
                       for k, s, rs, st in d.get("open") or ())
    kw["spans"] = tuple((str(k), float(s), float(e)) for k, s, e in d.get("spans") or ())
    kw["spans_s"] = tuple((str(k), float(v)) for k, v in d.get("spans_s") or ())
    return Attempt(**kw)


def training_s(a: Attempt, start: float, end: float) -> float:
    """Seconds of [start, end) in `a` outside its checkpoint and eval spans."""
    if end <= start:
        return 0.0
    return (end - start) - covered(a.all_spans(end), start, end)


def covered(spans: Iterable[Span], start: float, end: float) -> float:
    """Seconds of [start, end) covered by the union of `spans`."""
    cut = sorted((max(s, start), min(e, end)) for _, s, e in spans if e > start and s < end)
    total, at = 0.0, start
    for s, e in cut:
        s = max(s, at)
        if e > s:
            total += e - s
            at = e
    return total
