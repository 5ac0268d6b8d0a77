"""Time order across partitions with a bounded reorder window (pure: time passed in).

Each node's records land on one partition of the logs topic, in the order the node sent
them; different nodes' records are on different partitions (or interleaved on one), read at
different speeds. `Merger` holds rows in a heap by timestamp and lets one out when nothing
earlier can still come, within the bound `window_s` (docs/cli.md, "faultwatch logs"):

* reading history, a row is released once every partition that still has unread records has
  been read `window_s` past the row's timestamp (a partition at its end holds nothing back),
  so rows out of order by up to `window_s` on one partition (two nodes on one partition,
  stdout and stderr of one node, batching) and rows of different partitions come out in
  timestamp order;
* once every partition is at its end (following), a row is held at most `window_s` after it
  was read: rows read up to `window_s` apart are printed in timestamp order, a row later
  than that is printed when it is read, after rows stamped later than it;
* at most `max_held` rows are held: beyond that the earliest is released (memory bound).

Partitions far ahead of the slowest partition still being read can be paused
(`ahead_of`), so the heap holds about `pause_ahead_s` of output, not the whole topic.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Hashable
from dataclasses import dataclass
from typing import Generic, Protocol, TypeVar


class Stamped(Protocol):
    @property
    def ts(self) -> float: ...


R = TypeVar("R", bound=Stamped)

REORDER_WINDOW_S = 2.0  # default bound: an agent's batches linger ~0.2 s, a loaded one longer
MAX_HELD = 50_000
PAUSE_AHEAD_S = 30.0


@dataclass
class _Part:
    last_ts: float | None = None  # the latest timestamp read from this partition
    at_end: bool = False  # read to its end (nothing more to read now)


class Merger(Generic[R]):
    """Rows of many partitions in timestamp order, with the bound above."""

    def __init__(self, window_s: float = REORDER_WINDOW_S, max_held: int = MAX_HELD,
                 pause_ahead_s: float = PAUSE_AHEAD_S) -> None:
        if window_s < 0 or max_held < 1:
            raise ValueError("window_s must be >= 0 and max_held >= 1")
        self.window_s = window_s
        self.max_held = max_held
        self.pause_ahead_s = max(pause_ahead_s, window_s)
        self.parts: dict[Hashable, _Part] = {}
        self._heap: list[tuple[float, int, float, R]] = []  # (ts, read order, read at, row)
        self._n = 0

    def __len__(self) -> int:
        return len(self._heap)

    def partition(self, part: Hashable, at_end: bool) -> None:
        """Say whether `part` is read to its end now (every partition read must be named)."""
        self.parts.setdefault(part, _Part()).at_end = at_end

    def advance(self, part: Hashable, ts: float) -> None:
        """`part` was read up to `ts` (a record that gave no row: another job's)."""
        p = self.parts.setdefault(part, _Part())
        if math.isfinite(ts):
            p.last_ts = ts if p.last_ts is None else max(p.last_ts, ts)

    def push(self, part: Hashable, row: R, now: float) -> None:
        """A row read from `part` at `now` (any clock, the same for every call)."""
        self.advance(part, row.ts)
        heapq.heappush(self._heap, (row.ts, self._n, now, row))  # ties: read order
        self._n += 1

    def frontier(self) -> float | None:
        """How far every partition still being read has been read (None: none is; -inf:
        one has not given a row yet)."""
        pending = [p.last_ts for p in self.parts.values() if not p.at_end]
        if not pending:
            return None
        return min(-math.inf if t is None else t for t in pending)

    def ahead_of(self) -> set[Hashable]:
        """Partitions read more than `pause_ahead_s` past the frontier: pause them."""
        f = self.frontier()
        if f is None or f == -math.inf:
            return set()
        return {k for k, p in self.parts.items()
                if p.last_ts is not None and p.last_ts > f + self.pause_ahead_s}

    def pop(self, now: float, final: bool = False) -> list[R]:
        """The rows that may be printed now, in timestamp order; `final`: all of them."""
        out: list[R] = []
        heap = self._heap
        if final:
            while heap:
                out.append(heapq.heappop(heap)[3])
            return out
        f = self.frontier()
        if f is None:  # caught up: hold each row at most window_s after it was read
            due = now - self.window_s  # (the heap is small here: window_s of output)
            upto = max((ts for ts, _, read, _ in heap if read <= due), default=-math.inf)
        else:
            upto = f - self.window_s
        while heap and (heap[0][0] <= upto or len(heap) > self.max_held):
            out.append(heapq.heappop(heap)[3])
        return out
