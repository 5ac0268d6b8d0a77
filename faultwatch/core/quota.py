"""Quotas per node identity: how many new jobs and run-starts one node may start a minute
(token buckets; pure, time passed in).

A node's key lets it speak for itself, not flood the processor: 20,500 one-record jobs from
one node filled the job table in 9 s, and a real job's failure then went undecided. Each
node gets `per_min` tokens a minute of each kind, a minute's worth at once at most; a
run-start or new job beyond it is refused (the shell counts and logs it).

Time is the record's own (event) time, held within [now - HORIZON_S, now]: a processor
catching up on a backlog does not refuse what nodes started at their usual pace while it was
away, and a node that stamps its records in the past gains at most HORIZON_S of tokens.
What the buckets remember is bounded: a full bucket is the default and is forgotten first.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass, field

NEW_JOBS, RUN_STARTS = "new_jobs", "run_starts"
HORIZON_S = 600.0  # event time is believed this far into the past
MAX_BUCKETS = 100_000


@dataclass
class NodeQuota:
    """`take(kind, node, ts, now)`: True when `node` may start one more of `kind`."""

    new_jobs_per_min: float = 60.0
    run_starts_per_min: float = 120.0
    buckets: OrderedDict[tuple[str, str], tuple[float, float]] = field(
        default_factory=OrderedDict)  # (kind, node) -> (tokens, at)
    refused: dict[str, int] = field(default_factory=dict)  # kind -> count

    def rate(self, kind: str) -> float:
        return self.new_jobs_per_min if kind == NEW_JOBS else self.run_starts_per_min

    def take(self, kind: str, node: str, ts: float, now: float) -> bool:
        per_min = self.rate(kind)
        if per_min <= 0:
            return True  # 0: no quota
        t = min(now, max(ts, now - HORIZON_S))
        key = (kind, node)
        tokens, at = self.buckets.get(key, (per_min, t))
        if t > at:
            tokens = min(per_min, tokens + (t - at) * per_min / 60.0)
            at = t
        if tokens < 1.0:
            self.buckets[key] = (tokens, at)
            self.refused[kind] = self.refused.get(kind, 0) + 1
            return False
        self.buckets[key] = (tokens - 1.0, at)
        self.buckets.move_to_end(key)
        if len(self.buckets) > MAX_BUCKETS:
            self._forget(now)
        return True

    def _forget(self, now: float) -> None:
        """Drop the buckets that are full again by `now` (oldest first), then, if still too
        many, the least recently used."""
        for key in list(self.buckets):
            tokens, at = self.buckets[key]
            if tokens + (now - at) * self.rate(key[0]) / 60.0 >= self.rate(key[0]):
                del self.buckets[key]
        while len(self.buckets) > MAX_BUCKETS * 9 // 10:  # some room: not once per take
            self.buckets.popitem(last=False)
