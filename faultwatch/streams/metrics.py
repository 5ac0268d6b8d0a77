"""Counters of what a processor worker did (both stages), logged periodically."""

from __future__ import annotations

from dataclasses import dataclass, field


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
    extra: dict[str, int] = field(default_factory=dict)
    jobs_active: int = 0  # active jobs this worker tracks
    jobs_cached: int = 0  # ... and job states decoded in its cache (the rest: encoded)
    jobs_finished: int = 0  # decided and done jobs in its table, until finished_ttl_s
    max_jobs: int = 0  # the cap on active jobs (JobStage.max_jobs)
    storm: dict[str, object] = field(default_factory=dict)  # the blast-radius guard's state

    def count(self, name: str, n: int = 1) -> None:
        self.extra[name] = self.extra.get(name, 0) + n
