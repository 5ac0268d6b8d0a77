"""Per-rank training progress: step advances (stall detection) and step times (slow ranks)."""

from __future__ import annotations

from typing import Any, NamedTuple

from faultwatch.core.pmap import PMap

EWMA_ALPHA = 0.3  # weight of the newest step time
SLOW_CHECK_S = 10.0  # event-time interval between slow-rank scans (O(ranks) each)
SLOW_STRIKES = 3  # consecutive scans a rank must be an outlier before it is reported
SLOW_MIN_RANKS = 2
SLOW_MIN_DELTA_S = 0.01  # ignore outliers by less than this (timer noise)


class RankProg(NamedTuple):
    """One rank's latest step, when it last changed, its smoothed step time, its strikes.

    A NamedTuple: one is built per rank per progress mark, where a frozen dataclass's
    __init__ was a third of a progress fold."""

    step: int
    ts: float
    step_time_s: float | None = None
    strikes: int = 0
    node: str = ""

    def to_list(self) -> list[object]:
        return [self.step, self.ts, self.step_time_s, self.strikes, self.node]

    @classmethod
    def from_list(cls, x: list[Any]) -> RankProg:
        step, ts, stt, strikes, node = x
        return cls(int(step), float(ts), None if stt is None else float(stt), int(strikes),
                   str(node))


def fold_step(prev: RankProg | None, step: int, ts: float, step_time_s: float | None,
              node: str = "") -> tuple[RankProg, bool]:
    """The rank's new progress and whether its step advanced (changed: bars restart at 0)."""
    ewma = prev.step_time_s if prev is not None else None
    if step_time_s is not None and step_time_s >= 0:
        ewma = step_time_s if ewma is None else EWMA_ALPHA * step_time_s + (1 - EWMA_ALPHA) * ewma
    if prev is None:
        return RankProg(step, ts, ewma, 0, node), False
    if step != prev.step:
        return RankProg(step, max(ts, prev.ts), ewma, prev.strikes, node), True
    return RankProg(prev.step, prev.ts, ewma, prev.strikes, node), False


def low_median(values: list[float]) -> float:
    values = sorted(values)
    return values[(len(values) - 1) // 2]


def scan_slow(progress: PMap[int, RankProg],
              factor: float) -> tuple[PMap[int, RankProg], list[tuple[int, RankProg]], float]:
    """Update strikes: ranks whose smoothed step time exceeds factor x the job's (low)
    median gain one, others reset. Returns the new map, ranks that just reached
    SLOW_STRIKES, and the median."""
    times = [p.step_time_s for p in progress.values() if p.step_time_s is not None]
    if len(times) < SLOW_MIN_RANKS:
        return progress, [], 0.0
    med = low_median(times)
    out = progress
    reached: list[tuple[int, RankProg]] = []
    for rank, p in progress.items():
        slow = p.step_time_s is not None and p.step_time_s > factor * med \
            and p.step_time_s - med >= SLOW_MIN_DELTA_S
        strikes = p.strikes + 1 if slow else 0
        if strikes != p.strikes:
            q = RankProg(p.step, p.ts, p.step_time_s, strikes, p.node)
            out = out.set(rank, q)
            if strikes == SLOW_STRIKES:
                reached.append((rank, q))
    return out, reached, med
