"""Repeated events, counted: the first of each kind in full, then one summary line per interval.

A process that writes into a training job's stderr (the agent) must not write a line per
refused record: 5,000 forged decisions were 5,000 `decision_refused` lines (1 MB). `Quiet`
wraps a log callable; events named in `events` are logged in full the first time for each
`(event, reason)`, then counted, and `<event>_summary count=N by=reason:count,...` is logged
at most once per `interval_s` (on the next such event, or on `flush()`). Other events pass.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable, Iterable
from typing import Any


class Quiet:
    def __init__(self, log: Callable[..., None], events: Iterable[str],
                 interval_s: float = 60.0, clock: Callable[[], float] = time.monotonic):
        self._log, self.events, self.interval_s, self._clock = log, set(events), interval_s, \
            clock
        self._first: set[tuple[str, str]] = set()
        self._counts: dict[str, Counter[str]] = {}
        self._last_summary: dict[str, float] = {}
        self.total: Counter[str] = Counter()

    def __call__(self, event: str, **fields: Any) -> None:
        if event not in self.events:
            self._log(event, **fields)
            return
        reason = str(fields.get("reason", ""))
        self.total[event] += 1
        now = self._clock()
        if (event, reason) not in self._first:
            self._first.add((event, reason))
            self._last_summary.setdefault(event, now)
            self._log(event, **fields, repeats=f"counted, one {event}_summary line per "
                                                f"{self.interval_s:.0f} s")
            return
        self._counts.setdefault(event, Counter())[reason or "-"] += 1
        if now - self._last_summary.get(event, now) >= self.interval_s:
            self._summary(event, now)

    def _summary(self, event: str, now: float) -> None:
        c = self._counts.pop(event, None)
        self._last_summary[event] = now
        if c:
            self._log(f"{event}_summary", count=sum(c.values()), total=self.total[event],
                      by=",".join(f"{k}:{v}" for k, v in c.most_common(8)),
                      interval_s=self.interval_s)

    def flush(self) -> None:
        """Log what is counted and not yet summarised (at exit)."""
        now = self._clock()
        for event in list(self._counts):
            self._summary(event, now)
