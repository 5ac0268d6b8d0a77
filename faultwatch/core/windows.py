"""Silence windows: fixed, per stage, or learned from a job's own output cadence.

The learned ("adaptive") window of a job and stage is
    clamp(max(P99_FACTOR * p99(gap), MAX_FACTOR * max(gap)), hang_floor_s, hang_ceiling_s)
over the gaps between consecutive outputs seen after the warm-up of an attempt, and is never
shorter than the window a stage declares. Gaps are kept in a log-bucketed histogram (a few
dozen integers per job and stage).

Progress steps teach it too, which is what makes real frameworks work with no
configuration: their steady output is a progress bar (tqdm, rich, Lightning) redrawn in
place and shipped rate-limited, so a short run shows few *outputs* but many *steps*. A
progress observation that advanced k steps over dt is k steps each done within dt: it
counts as min(k, STEP_WEIGHT_MAX) samples of the gap dt (never dt / k: a job that logs every
50 iterations is silent for the whole dt). Until the output gaps have MIN_SAMPLES samples,
the hang window comes from those step gaps.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from faultwatch.core.pmap import PMap
from faultwatch.core.policy import Policy

GAP_MIN_S = 1 / 16  # gaps below this are not samples (same batch, clock jitter)
BUCKETS_PER_OCTAVE = 4
MIN_SAMPLES = 10  # a histogram with fewer gaps has learned nothing yet
MAX_COUNT = 10_000  # past this many samples all counts are halved (slow forgetting)
P99_FACTOR = 5.0
MAX_FACTOR = 2.0
WARMUP_STEPS = 2  # progress steps an attempt must advance before its output gaps are samples
STEP_WEIGHT_MAX = MIN_SAMPLES  # samples one progress observation is worth at most
WARMUP_OUTPUTS = 20  # ... or outputs, for jobs that report no progress
DEFAULT_STAGE = ""
STEPS_HIST = "@steps"  # histogram key of the gaps between progress observations


def _bucket(gap: float) -> int:
    return max(0, math.ceil(math.log2(gap / GAP_MIN_S) * BUCKETS_PER_OCTAVE))


def _upper(bucket: int) -> float:
    return GAP_MIN_S * 2 ** (bucket / BUCKETS_PER_OCTAVE)


@dataclass(frozen=True, slots=True)
class GapHist:
    """Counts of observed gaps in log2 buckets (upper bounds are ~19% apart), as
    (bucket, count) pairs sorted by bucket: immutable, a few dozen pairs at most."""

    counts: tuple[tuple[int, int], ...] = ()
    n: int = 0

    def add(self, gap: float, weight: int = 1) -> GapHist:
        """The histogram with `weight` more samples of `gap` (gaps below GAP_MIN_S: none)."""
        if gap < GAP_MIN_S or weight < 1:
            return self
        b = _bucket(gap)
        counts = dict(self.counts)
        counts[b] = counts.get(b, 0) + weight
        n = self.n + weight
        if n > MAX_COUNT:
            counts = {k: v // 2 for k, v in counts.items() if v // 2}
            n = sum(counts.values())
        return GapHist(tuple(sorted(counts.items())), n)

    def quantile(self, q: float) -> float | None:
        if self.n == 0:
            return None
        need = q * self.n
        seen = 0
        for b, c in self.counts:
            seen += c
            if seen >= need:
                return _upper(b)
        return _upper(self.counts[-1][0])

    def max(self) -> float | None:
        return _upper(self.counts[-1][0]) if self.counts else None

    def learned(self, policy: Policy) -> float | None:
        """The adaptive window this histogram implies, or None before MIN_SAMPLES gaps."""
        if self.n < MIN_SAMPLES:
            return None
        p99, top = self.quantile(0.99), self.max()
        assert p99 is not None and top is not None
        raw = max(P99_FACTOR * p99, MAX_FACTOR * top)
        return min(max(raw, policy.hang_floor_s), policy.hang_ceiling_s)

    def summary(self) -> dict[str, Any]:
        p99 = self.quantile(0.99)
        return {"samples": self.n, "p50_s": _r(self.quantile(0.5)), "p99_s": _r(p99),
                "max_s": _r(self.max())}

    def to_list(self) -> list[list[int]]:
        return [[k, v] for k, v in self.counts]

    @classmethod
    def from_list(cls, rows: list[list[int]]) -> GapHist:
        counts = {int(k): int(v) for k, v in rows}
        return cls(tuple(sorted(counts.items())), sum(counts.values()))


def _r(x: float | None) -> float | None:
    return None if x is None else round(x, 3)


@dataclass(frozen=True, slots=True)
class OpenStage:
    """A stage a rank is in: its declared window (None: no hang detection) and start."""

    stage: str
    window_s: float | None
    since: float


def choose_window(policy: Policy, stages: list[OpenStage], hists: PMap[str, GapHist],
                  warmed_up: bool) -> tuple[float | None, dict[str, Any]]:
    """The silence window in effect now, and how it was chosen (for the evidence).

    - A stage is open on some rank: the most lenient open stage wins; a stage with no window
      turns detection off; else its declared window, lengthened by what was learned for that
      stage (adaptive) but never shortened.
    - No stage: an explicit `hang_window_s` is a fixed window; else the learned window
      (adaptive): from the output gaps after warm-up, else from the progress steps (see the
      module doc), else `hang_ceiling_s`.
    """
    if stages:
        off = next((s for s in stages if s.window_s is None), None)
        if off is not None:
            return None, {"basis": "stage", "stage": off.stage, "since": off.since}
        top = max(stages, key=lambda s: s.window_s or 0.0)
        assert top.window_s is not None
        window = top.window_s
        basis: dict[str, Any] = {"basis": "stage", "stage": top.stage, "declared_s": window,
                                 "since": top.since}
        hist = hists.get(top.stage)
        learned = hist.learned(policy) if hist is not None and policy.adaptive_hang else None
        if learned is not None and learned > window:
            window = learned
            basis["learned"] = hist.summary() if hist is not None else {}
        return window, basis
    if policy.hang_window_s is not None:
        return policy.hang_window_s, {"basis": "fixed"}
    if policy.adaptive_hang:
        sources = ((hists.get(DEFAULT_STAGE) if warmed_up else None, "output gaps"),
                   (hists.get(STEPS_HIST), "progress steps"))
        for hist, what in sources:
            learned = hist.learned(policy) if hist is not None else None
            if learned is not None and hist is not None:
                return learned, {"basis": "adaptive", "learned_from": what,
                                 "learned": hist.summary(), "floor_s": policy.hang_floor_s,
                                 "ceiling_s": policy.hang_ceiling_s}
    out: dict[str, Any] = {"basis": "ceiling" if policy.adaptive_hang else "default",
                           "warmed_up": warmed_up}
    if policy.adaptive_hang:  # why nothing was learned yet
        out["samples"] = {what: hists[k].n for k, what in ((DEFAULT_STAGE, "output gaps"),
                                                           (STEPS_HIST, "progress steps"))
                          if k in hists}
        out["min_samples"] = MIN_SAMPLES
    return policy.hang_ceiling_s, out


def describe_basis(basis: dict[str, Any]) -> str:
    """How a window was chosen, in a few words ("adaptive from progress steps: 15 samples,
    p99 1.19s")."""
    kind = str(basis.get("basis", "?"))
    if kind == "adaptive":
        lr = basis.get("learned") or {}
        return f"adaptive from {basis.get('learned_from', '?')}: {lr.get('samples')} " \
               f"samples, p99 {lr.get('p99_s')}s"
    if kind == "stage":
        return f"stage {basis.get('stage')!r}"
    if kind == "ceiling":
        return "ceiling: nothing learned yet"
    return kind
