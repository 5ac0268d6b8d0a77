"""What the processor learned from earlier runs of a job, read back from its decisions and status
snapshot (pure: decoded records in): start skew per attempt, the learned output cadence
(the adaptive hang window), how long checkpoints kept the ranks silent.

The processor records a start skew only when it reaches its `skew_warn_s` (a `start-skew`
notice, spread_s) or when nodes are still missing then (a `missing-nodes` notice: a lower
bound); attempts below it leave no record. So the skew known here is the largest recorded
in the last runs, with that floor; never a guess below it.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

LAST_RUNS = 5  # the runs of a job the summary looks at (newest first)
NO_BOOTSTRAP = "not read: no --bootstrap (faultwatch check --bootstrap reads earlier runs)"


@dataclass(frozen=True)
class Skew:
    run_id: str
    attempt: int
    spread_s: float
    lower_bound: bool = False  # a missing-nodes notice: at least this much


@dataclass(frozen=True)
class Learned:
    """`available`: the decisions and status were read (else `why` not); `runs`: the runs
    of the job they name (the last LAST_RUNS); `skews` of those runs; `skew_floor_s`: the
    processor's skew_warn_s (below it nothing is recorded); the learned window now."""

    available: bool = False
    why: str = NO_BOOTSTRAP
    runs: tuple[str, ...] = ()
    skews: tuple[Skew, ...] = ()
    skew_floor_s: float | None = None
    window_s: float | None = None
    window_basis: str | None = None
    checkpoint_silences_s: tuple[float, ...] = ()

    @property
    def max_skew_s(self) -> float | None:
        return max((s.spread_s for s in self.skews), default=None)

    def to_dict(self) -> dict[str, Any]:
        return {"available": self.available, "why": self.why, "runs": list(self.runs),
                "skews": [{"run_id": s.run_id, "attempt": s.attempt, "spread_s": s.spread_s,
                           "at_least": s.lower_bound} for s in self.skews],
                "max_skew_s": self.max_skew_s, "skew_floor_s": self.skew_floor_s,
                "window_s": self.window_s, "window_basis": self.window_basis,
                "checkpoint_silences_s": list(self.checkpoint_silences_s)}


def _num(x: Any) -> float | None:
    return float(x) if isinstance(x, int | float) and not isinstance(x, bool) else None


def learned_from(decisions: Iterable[Mapping[str, Any]], status: Mapping[str, Any] | None,
                 last_runs: int = LAST_RUNS) -> Learned:
    """The summary of one job's decisions (decision_to_dict shapes, any order) and its
    latest status snapshot (None: none published)."""
    decs = sorted((d for d in decisions if isinstance(d, Mapping)),
                  key=lambda d: _num(d.get("ts")) or 0.0)
    runs: list[str] = []
    for d in reversed(decs):
        rid = str(d.get("run_id") or "")
        if rid not in runs:
            runs.append(rid)
    if status is not None and str(status.get("run_id") or "") not in runs:
        runs.insert(0, str(status.get("run_id") or ""))
    keep = set(runs[:last_runs])
    skews: list[Skew] = []
    floor: float | None = None
    ckpt: list[float] = []
    for d in decs:
        rid = str(d.get("run_id") or "")
        if rid not in keep:
            continue
        reason: Mapping[str, Any] = d["reason"] if isinstance(d.get("reason"), Mapping) else {}
        ev: Mapping[str, Any] = d["evidence"] if isinstance(d.get("evidence"), Mapping) else {}
        kind, ts = reason.get("kind"), _num(d.get("ts"))
        attempt = int(d["attempt"]) if isinstance(d.get("attempt"), int) else 0
        if kind == "skew" and _num(ev.get("spread_s")) is not None:
            skews.append(Skew(rid, attempt, float(ev["spread_s"])))
            floor = _num(ev.get("window_s")) or floor
        elif kind == "skew" and ts is not None and _num(ev.get("first_start_ts")) is not None:
            skews.append(Skew(rid, attempt, round(ts - float(ev["first_start_ts"]), 3), True))
        elif kind == "hang-deferred" and ev.get("why") == "checkpoint" and ts is not None \
                and _num(ev.get("silent_since")) is not None:
            ckpt.append(round(ts - float(ev["silent_since"]), 3))
    window = basis = None
    if status is not None:
        window = _num(status.get("window_s"))
        basis = str(status["window_basis"]) if status.get("window_basis") else None
    return Learned(available=True, why="", runs=tuple(runs[:last_runs]), skews=tuple(skews),
                   skew_floor_s=floor, window_s=window, window_basis=basis,
                   checkpoint_silences_s=tuple(ckpt))
