"""A per-node line budget for the matcher stage: a node printing past it has the lines of its
records beyond the budget counted, not matched (liveness still goes out), and each episode is
announced as a `gap` notice (a notify decision) at its start and its end: a flood of one node
never blinds the worker to the others, and is never silent."""

from __future__ import annotations

from dataclasses import dataclass

from faultwatch import settings

# lines per second each node may have matched (event time); 0: no budget
NODE_LINES_PER_S: float = settings.NODE_LINES_PER_S.fallback
BURST_S = 10.0  # ... with this many seconds' worth of lines in hand (a burst, a backlog)
BUDGET_ENV = settings.NODE_LINES_PER_S.name
MAX_NODES = 200_000  # nodes tracked; past it the idle ones go
IDLE_S = 120.0  # a node quiet this long (event time) is forgotten


def budget_from_env() -> float:
    """$FAULTWATCH_NODE_LINES_PER_S as a number (0 turns the budget off)."""
    return settings.NODE_LINES_PER_S.value()


@dataclass(slots=True)
class _Bucket:
    tokens: float
    ts: float  # event time of the last refill
    throttled: int = 0  # lines not matched in the current episode (0: none open)
    since: float = 0.0  # when the episode started (event time)


@dataclass(frozen=True, slots=True)
class Episode:
    """A throttling episode that started or ended with this record."""

    started: bool  # False: ended
    lines: int  # lines not matched in it so far (at the start: this record's)
    since: float


class LineBudget:
    """Token buckets of lines per (job, node), refilled by the records' own times (event
    time: a backlog read fast is not a flood; a node whose clock runs fast only throttles
    itself). `lines_per_s` 0: never throttles."""

    def __init__(self, lines_per_s: float = NODE_LINES_PER_S, burst_s: float = BURST_S) -> None:
        self.rate = lines_per_s
        self.cap = lines_per_s * burst_s
        self.nodes: dict[tuple[str, str], _Bucket] = {}

    def take(self, key: tuple[str, str], lines: int, ts: float
             ) -> tuple[bool, Episode | None]:
        """(whether a record of `lines` lines at `ts` is within the node's budget, the
        episode it starts or ends if any). A record over it does not spend the budget."""
        if self.rate <= 0:
            return True, None
        b = self.nodes.get(key)
        if b is None:
            if len(self.nodes) >= MAX_NODES:
                self._forget(ts)
            b = self.nodes[key] = _Bucket(self.cap, ts)
        elif ts > b.ts:
            b.tokens = min(self.cap, b.tokens + (ts - b.ts) * self.rate)
            b.ts = ts
        if b.tokens >= lines:
            b.tokens -= lines
            if b.throttled and b.tokens >= self.cap / 2:  # a while under the budget again
                ended = Episode(False, b.throttled, b.since)
                b.throttled = 0
                return True, ended
            return True, None
        started = None if b.throttled else Episode(True, lines, ts)
        if started is not None:
            b.since = ts
        b.throttled += lines
        return False, started

    def _forget(self, now: float) -> None:
        idle = [k for k, b in self.nodes.items() if b.ts < now - IDLE_S and not b.throttled]
        for k in idle or list(self.nodes)[:len(self.nodes) // 2]:
            del self.nodes[k]
