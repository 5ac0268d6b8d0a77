"""Which run ledgers a processor publishes on <prefix>incidents, and when: a run's at once when
what a reader acts on changed (an attempt, an incident, its acting and recovery, a checkpoint,
an exit), every active run's goodput so far at a slow cadence (at most REFRESH_MAX_PER_S a
second), and the last ledger of a run a new run replaced. The goodput metrics of what it
publishes are kept here too (the board that /metrics reads)."""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterable, MutableSequence
from dataclasses import dataclass, field
from typing import Protocol

from faultwatch.core.goodput import PARTS, PRODUCTIVE, Account, account
from faultwatch.core.ledger import Ledger
from faultwatch.core.state import JobState, Phase
from faultwatch.wire.incidents import encode_ledger, incident_key

REFRESH_S = 60.0  # an active run's ledger is republished this often (its goodput so far)
REFRESH_MAX_PER_S = 20.0  # ... with at most this many such refreshes a second per worker
CALL_S = 3.0  # how often the shell calls due() (the status timer's cadence)
MAX_JOB_SERIES = 1000  # jobs with a faultwatch_job_goodput_ratio series (the newest)
MAX_RECOVERED = 10_000  # incident ids whose recovery time was observed (dedupe)
RECOVERY_BUCKETS_S = (1.0, 5.0, 15.0, 30.0, 60.0, 120.0, 300.0, 600.0, 1800.0, 3600.0, 7200.0)
ACTIVE = (Phase.RUNNING, Phase.SETTLING)

class Partitions(Protocol):
    """What the publisher reads of a signals partition's cache (job_stage.PartitionCache)."""

    cache: dict[bytes, JobState]


@dataclass
class GoodputBoard:
    """What /metrics shows of the published ledgers: each job's goodput ratio (the newest
    MAX_JOB_SERIES jobs), productive and badput seconds by cause (counters: the growth of each
    run's account between its publications), incident recovery times (a histogram), and the
    lemon nodes the watch names now."""

    ratios: OrderedDict[str, float] = field(default_factory=OrderedDict)
    seconds: dict[str, float] = field(default_factory=lambda: dict.fromkeys(
        (PRODUCTIVE, *PARTS), 0.0))
    buckets: list[int] = field(default_factory=lambda: [0] * len(RECOVERY_BUCKETS_S))
    recovery_count: int = 0
    recovery_sum: float = 0.0
    recovered: OrderedDict[str, None] = field(default_factory=OrderedDict)
    bounds: tuple[float, ...] = RECOVERY_BUCKETS_S  # the histogram's upper bounds (le)

    def ratio(self, job: str, value: float | None) -> None:
        self.ratios.pop(job, None)
        if value is None:
            return
        self.ratios[job] = value
        while len(self.ratios) > MAX_JOB_SERIES:
            self.ratios.popitem(last=False)

    def grow(self, new: Account, old: Account | None) -> None:
        parts = {PRODUCTIVE: new.productive_s, **new.badput}
        was = {} if old is None else {PRODUCTIVE: old.productive_s, **old.badput}
        for k, v in parts.items():
            self.seconds[k] = self.seconds.get(k, 0.0) + max(0.0, v - was.get(k, 0.0))

    def recovery(self, incident: str, seconds: float) -> None:
        if incident in self.recovered:
            return
        self.recovered[incident] = None
        while len(self.recovered) > MAX_RECOVERED:
            self.recovered.popitem(last=False)
        self.recovery_count += 1
        self.recovery_sum += seconds
        for i, b in enumerate(self.bounds):
            if seconds <= b:
                self.buckets[i] += 1


@dataclass
class _Seen:
    run_id: str
    rev: int
    published_s: float
    account: Account


class IncidentPublisher:
    """`due(parts, retired, now)` -> (key, record) pairs for the incidents topic (see the
    module docstring); `board` holds the metrics of what was published."""

    def __init__(self, refresh_s: float = REFRESH_S, max_per_s: float = REFRESH_MAX_PER_S,
                 call_s: float = CALL_S) -> None:
        self.refresh_s = refresh_s
        self.max_per_s = max_per_s
        self.call_s = call_s
        self.seen: OrderedDict[bytes, _Seen] = OrderedDict()  # oldest publication first
        self.board = GoodputBoard()

    def _record(self, led: Ledger, now: float, final: bool, old: Account | None
                ) -> tuple[bytes, bytes, Account]:
        acc = account(led)
        self.board.grow(acc, old)
        self.board.ratio(led.job, acc.ratio)
        for i in led.incidents:
            if i.recovered_ts is not None:
                self.board.recovery(i.id, max(0.0, i.recovered_ts - i.first_sign_ts))
        return incident_key(led.job, led.run_id), encode_ledger(led, acc, now, final), acc

    def due(self, parts: Iterable[Partitions], retired: MutableSequence[Ledger] | None,
            now: float) -> list[tuple[bytes, bytes]]:
        """The records to publish now; `retired` (job_stage.retired_ledgers) is emptied."""
        out: list[tuple[bytes, bytes]] = []
        for led in list(retired or ()):
            s = next((x for x in self.seen.values() if x.run_id == led.run_id), None)
            key, value, _ = self._record(led, now, True, s.account if s else None)
            out.append((key, value))
        if retired is not None:
            retired.clear()
        current: dict[bytes, JobState] = {}
        for p in parts:
            for key, st in p.cache.items():
                if st.ledger.attempts:
                    current[key] = st
        for key in [k for k in self.seen if k not in current]:
            del self.seen[key]  # left this worker's cache: its last change was published
        publish: list[bytes] = []
        for key, st in current.items():
            s = self.seen.get(key)
            if s is None or s.run_id != st.ledger.run_id or s.rev != st.ledger.rev:
                publish.append(key)
        budget = int(self.max_per_s * self.call_s)
        chosen = set(publish)
        for key, s in self.seen.items():  # unchanged active runs, the oldest record first
            if budget <= 0 or now - s.published_s < self.refresh_s:
                break
            if key not in chosen and current[key].phase in ACTIVE:
                publish.append(key)
                budget -= 1
        for key in publish:
            led = current[key].ledger
            s = self.seen.pop(key, None)
            old = s.account if s is not None and s.run_id == led.run_id else None
            k, value, acc = self._record(led, now, False, old)
            self.seen[key] = _Seen(led.run_id, led.rev, now, acc)
            out.append((k, value))
        return out

    def final(self, parts: Iterable[Partitions], now: float) -> list[tuple[bytes, bytes]]:
        """Every held run's ledger once more, marked final (embedded mode's exit)."""
        out = []
        for p in parts:
            for key, st in p.cache.items():
                if st.ledger.attempts:
                    s = self.seen.pop(key, None)
                    k, value, _ = self._record(st.ledger, now, True,
                                               s.account if s is not None else None)
                    out.append((k, value))
        return out
