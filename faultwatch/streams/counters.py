"""Counters of what a processor worker did (both stages), logged periodically."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal, get_args

from faultwatch.core.blast import GuardState

# the named counts of count(): a name not listed here fails mypy at the call, and /metrics
# (faultwatch/metrics.StageCounters) reads its four through counted(), typed the same way
Counted = Literal["heartbeats_folded", "lines_throttled", "nodes_throttled", "dropped.no-run",
                  "decisions_withheld", "jobs_broken", "jobs_evicted", "jobs_evicted_cheap",
                  "jobs_expired", "jobs_refused", "table_writes", "table_bytes"]
COUNTED: tuple[Counted, ...] = get_args(Counted)
# counts kept per label: decisions per kind, run-starts refused per quota
Labelled = Literal["decisions.", "dropped.quota-"]


@dataclass
class Metrics:
    """Counters of what this worker did, logged periodically."""

    records: int = 0
    lines: int = 0
    signals: int = 0
    signals_records: int = 0
    decisions: int = 0
    dead_letters: int = 0
    jobs_signals: int = 0
    logs_event_lag_s: float = 0.0  # processor time - event time of the latest logs record
    tick_lag_s: dict[int, float] = field(default_factory=dict)
    extra: dict[str, int] = field(default_factory=dict)  # count()'s and count_labelled()'s
    jobs_active: int = 0  # active jobs this worker tracks
    jobs_cached: int = 0  # ... and job states decoded in its cache (the rest: encoded)
    jobs_finished: int = 0  # decided and done jobs in its table, until finished_ttl_s
    max_jobs: int = 0  # the cap on active jobs (JobStage.max_jobs)
    storm: GuardState = GuardState()  # the blast-radius guard's state

    def count(self, name: Counted, n: int = 1) -> None:
        self.extra[name] = self.extra.get(name, 0) + n

    def count_labelled(self, family: Labelled, label: str, n: int = 1) -> None:
        key = family + label
        self.extra[key] = self.extra.get(key, 0) + n

    def counted(self, name: Counted) -> int:
        return self.extra.get(name, 0)
