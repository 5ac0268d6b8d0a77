"""A job stage's states (streams/job_stage.py): the store, each signals partition's
write-behind cache, and the bounds on what a worker holds (idle states leave the cache,
finished jobs leave the table, a full table forgets its phantom jobs first)."""

from __future__ import annotations

import heapq
from collections.abc import Iterable, Iterator, MutableMapping
from dataclasses import dataclass, field
from typing import Protocol

import orjson

from faultwatch import settings
from faultwatch.core import spares
from faultwatch.core.blast import BlastGuard
from faultwatch.core.events import RunStart
from faultwatch.core.job import JobState, Phase
from faultwatch.core.quota import NEW_JOBS, NodeQuota
from faultwatch.eventlog import Quiet, log_event
from faultwatch.streams import job_table
from faultwatch.streams.counters import Metrics
from faultwatch.streams.records import LiveRules
from faultwatch.trust.refusals import REFUSALS

WRITE_BEHIND_S = 5.0  # a job whose only changes are liveness is written at most this often
LIVENESS_WRITES_MAX_PER_S = 200.0  # ... and with more active jobs, less often (write_behind_s)
ACTIVE = (Phase.RUNNING, Phase.SETTLING)
JOB_IDLE_S = 60.0  # a cached state untouched this long leaves the cache (active ones: at
# least node_lost_s); its encoded state stays in the store (the table, changelog-backed)
# active jobs per worker; a new job beyond it is refused (counted, logged)
MAX_JOBS: int = settings.MAX_JOBS.fallback
# a decided or done job unchanged this long leaves the table too
FINISHED_TTL_S: float = settings.FINISHED_TTL_S.fallback
# (a tombstone on its changelog): like a Kubernetes Job's ttlSecondsAfterFinished; a job that
# returns later starts afresh (docs/operating.md 5a). Keep it above the longest relaunch delay
PARTITION_FIELD = "_p"  # stored beside a state: the signals partition it belongs to


class StateStore(Protocol):
    """Where job states live durably: raw encoded states by job key."""

    def get(self, key: bytes) -> bytes | None: ...

    def put(self, partition: int, key: bytes, value: bytes) -> None: ...

    def items(self) -> Iterable[tuple[bytes, bytes | None]]: ...

    def delete(self, partition: int, key: bytes) -> None: ...


class DictStore:
    """A StateStore in memory (embedded mode, tests)."""

    def __init__(self, data: MutableMapping[bytes, bytes] | None = None) -> None:
        self.data: MutableMapping[bytes, bytes] = {} if data is None else data

    def get(self, key: bytes) -> bytes | None:
        return self.data.get(key)

    def put(self, partition: int, key: bytes, value: bytes) -> None:
        self.data[key] = value

    def items(self) -> Iterator[tuple[bytes, bytes | None]]:
        return iter(list(self.data.items()))

    def delete(self, partition: int, key: bytes) -> None:
        self.data.pop(key, None)


@dataclass
class PartitionCache:
    """A signals partition this worker owns: cached job states, dirty and active keys.

    A tick costs what is due, not one call per job: `settling` jobs are ticked every time
    (settle fallback), running ones only when their oldest live node may be lost
    (`lost_due`: a heap of (earliest seen_at, key), re-checked lazily), and write-behind
    takes the dirty jobs whose write is due from `write_due` ((due, key), lazily)."""

    since: float  # when this worker (re)started serving the partition, or caught up
    last_tick: float | None = None
    cache: dict[bytes, JobState] = field(default_factory=dict)
    dirty: set[bytes] = field(default_factory=set)
    active: set[bytes] = field(default_factory=set)
    written: dict[bytes, float] = field(default_factory=dict)  # last store write (processor)
    broken: set[bytes] = field(default_factory=set)  # jobs whose state failed a tick
    settling: set[bytes] = field(default_factory=set)
    lost_due: list[tuple[float, bytes]] = field(default_factory=list)
    lost_queued: set[bytes] = field(default_factory=set)  # keys with an entry in lost_due
    write_due: list[tuple[float, bytes]] = field(default_factory=list)
    touched: dict[bytes, float] = field(default_factory=dict)  # cached key -> last load/save
    swept: float = float("-inf")  # the last idle sweep
    finished: dict[bytes, float] = field(default_factory=dict)  # decided/done key -> last save
    expire_due: list[tuple[float, bytes]] = field(default_factory=list)  # (due, key), lazily
    names: dict[bytes, tuple[str, ...]] = field(default_factory=dict)  # active key -> nodes
    cheap: dict[bytes, None] = field(default_factory=dict)  # active, shown nothing: oldest 1st
    # decided or done since the status publisher last looked: each gets its last snapshot,
    # the job that ended between two looks too (streams/status_publish.py)
    ended: set[bytes] = field(default_factory=set)

    def watch(self, key: bytes, since: float) -> None:
        """`key` is active: its node-lost check is due no earlier than `since` + window."""
        if key not in self.lost_queued:
            self.lost_queued.add(key)
            heapq.heappush(self.lost_due, (since, key))


def earliest_seen(st: JobState) -> float | None:
    """Processor time of the least recently heard-from live node or waiting spare (node
    lost), or None."""
    seen = [n.seen_at for n in st.nodes.values() if n.alive and n.seen_at is not None]
    spare = spares.earliest_seen(st) if st.spares else None
    if spare is not None:
        seen.append(spare)
    return min(seen) if seen else None


class JobStates:
    """The states half of JobStage: loading, saving and writing behind, and the bounds.
    JobStage sets these attributes in its __init__."""

    parts: dict[int, PartitionCache]
    store: StateStore
    metrics: Metrics
    live: LiveRules
    max_jobs: int
    finished_ttl_s: float
    guard: BlastGuard
    quota: NodeQuota | None
    quiet: Quiet
    _batch_writes: dict[bytes, tuple[int, PartitionCache]] | None
    _refusing: bool
    _released: int
    _released_at: float

    def write_behind_s(self) -> float:
        """How long a job's liveness-only changes may wait for their table write: every
        WRITE_BEHIND_S, or with many active jobs at most LIVENESS_WRITES_MAX_PER_S writes a
        second for this worker (each write is a changelog record). What waits is restored
        by the node's next records after a crash (docs/decisions.md)."""
        active = sum(len(p.active) for p in self.parts.values())
        return max(WRITE_BEHIND_S, active / LIVENESS_WRITES_MAX_PER_S)

    # ---- states -------------------------------------------------------------------------

    def partition(self, partition: int, now: float) -> PartitionCache:
        """The cache of a partition, built (active jobs found in the store) on first use
        after an assignment."""
        p = self.parts.get(partition)
        if p is None:
            p = self.parts[partition] = PartitionCache(since=now)
            for k, raw in self.store.items():
                if raw is None:
                    continue
                try:
                    d = orjson.loads(raw)
                    if d.get(PARTITION_FIELD) != partition:
                        continue
                    if d.get("phase") in ACTIVE:
                        p.active.add(k)
                        job_table.note_raw(p, k, d)
                        p.watch(k, now)  # checked once the grace has passed
                        if d.get("phase") == Phase.SETTLING:
                            p.settling.add(k)
                    else:  # its time-to-live counts from now (this worker's first sight)
                        self._finished(k, p, now)
                except (orjson.JSONDecodeError, AttributeError):
                    continue
        return p

    def load(self, key: bytes, p: PartitionCache) -> JobState | None:
        st = p.cache.get(key)
        if st is not None:
            return st
        raw = self.store.get(key)
        if raw is None:
            return None
        st = JobState.from_dict(orjson.loads(raw))
        p.cache[key] = st
        p.touched[key] = p.since if p.last_tick is None else p.last_tick
        return st

    # ---- bounded state ------------------------------------------------------------------

    def evict_idle(self, partition: int, p: PartitionCache, now: float) -> int:
        """Drop the cached states untouched for JOB_IDLE_S (active ones: at least
        node_lost_s, so an uncached active job is a silent one), written first if dirty: the
        encoded state stays in the store and load() brings it back when the job reports
        again or a check is due. Returns how many left."""
        p.swept = now
        idle = now - JOB_IDLE_S
        idle_active = now - max(JOB_IDLE_S, self.live.policy.node_lost_s)
        gone = [k for k, t in p.touched.items()
                if t <= idle and (t <= idle_active or k not in p.active)
                and k not in p.settling]
        for key in gone:
            if key in p.dirty:
                self._write(key, partition, p, now)
            p.cache.pop(key, None)
            p.touched.pop(key, None)
            p.written.pop(key, None)
        if gone:
            self.metrics.count("jobs_evicted", len(gone))
            self.released(len(gone), now)
        return len(gone)

    def _finished(self, key: bytes, p: PartitionCache, now: float) -> None:
        """`key` is decided or done as of `now`: one queue entry per key (re-queued when it
        comes due after a later change), however often it changes."""
        if key not in p.finished:
            heapq.heappush(p.expire_due, (now + self.finished_ttl_s, key))
        p.finished[key] = now

    def expire_finished(self, partition: int, p: PartitionCache, now: float) -> int:
        """Delete the decided and done jobs unchanged for finished_ttl_s from the cache and
        the store (a tombstone on the table's changelog): what a worker holds is bounded by
        the jobs that finish in a TTL, not by every job it ever saw. Returns how many."""
        gone = 0
        ttl = self.finished_ttl_s
        while p.expire_due and p.expire_due[0][0] <= now:
            _, key = heapq.heappop(p.expire_due)
            last = p.finished.get(key)
            if last is None or key in p.active:
                continue  # active again, or expired already
            if last + ttl > now:  # changed since it was queued (a late record)
                heapq.heappush(p.expire_due, (last + ttl, key))
                continue
            self.store.delete(partition, key)
            for d in (p.finished, p.cache, p.touched, p.written):
                d.pop(key, None)
            job_table.forget(p, key)
            p.dirty.discard(key)
            p.broken.discard(key)
            gone += 1
        if gone:
            self.released(gone, now)
            self.metrics.count("jobs_expired", gone)
            log_event("jobs_expired", partition=partition, jobs=gone,
                      finished_ttl_s=ttl)
        return gone

    def new_job_allowed(self, start: RunStart, now: float) -> bool:
        """The node of a new job's first run-start is within its new-jobs quota."""
        if self.quota is None or self.quota.take(NEW_JOBS, start.node, start.ts, now):
            return True
        self.refused_start(start, NEW_JOBS)
        return False

    def refused_start(self, start: RunStart, kind: str) -> None:
        """A run-start beyond its node's quota (of new jobs or of run-starts): counted in
        faultwatch_refused_total{what="run",reason="quota_<kind>"} and logged (quietly)."""
        self.metrics.count_labelled("dropped.quota-", kind)
        REFUSALS[("run", f"quota_{kind}")] += 1
        self.quiet("run_start_refused", reason=f"quota_{kind}:{start.node}", job=start.job,
                   node=start.node, run_id=start.run_id,
                   limit_per_min=self.quota.rate(kind) if self.quota is not None else None)

    def refuse(self, job: str, now: float) -> bool:
        """A new job at the cap (max_jobs active on this worker) takes the place of the
        active job that has shown nothing for longest (a run-start alone: job_table); with
        none, it is refused: counted, one line when refusing starts (and its count in
        processor_metrics' counters)."""
        active = sum(len(p.active) for p in self.parts.values())
        if active >= self.max_jobs and self.evict_cheapest(now):
            active -= 1
        if active < self.max_jobs:
            if self._refusing:
                self._refusing = False
                log_event("job_cap_cleared", active=active, max_jobs=self.max_jobs)
            return False
        self.metrics.count("jobs_refused")
        if not self._refusing:
            self._refusing = True
            log_event("job_cap_reached", active=active, max_jobs=self.max_jobs, job=job,
                      note=f"new jobs are refused until active ones end ({settings.MAX_JOBS})")
        return True

    def released(self, states: int, now: float) -> None:
        """Many states just left the cache or the table: give the freed memory back to the
        system (job_table.release_memory), at most once a minute."""
        self._released += states
        if self._released >= job_table.RELEASE_AFTER and \
                now - self._released_at >= job_table.RELEASE_EVERY_S:
            self._released, self._released_at = 0, now
            job_table.release_memory()

    def evict_cheapest(self, now: float) -> bool:
        """Delete the active job that has shown nothing for longest (its state and a
        tombstone on the changelog): True when there was one."""
        found = job_table.oldest_cheap(self.parts)
        if found is None:
            return False
        partition, key = found
        p = self.parts[partition]
        self.store.delete(partition, key)
        for d in (p.cache, p.touched, p.written, p.finished):
            d.pop(key, None)
        for s in (p.active, p.dirty, p.settling, p.broken):
            s.discard(key)
        job_table.forget(p, key)
        self.guard.drop(key)
        self.metrics.count("jobs_evicted_cheap")
        self.quiet("job_evicted", reason="shown_nothing", job=key.decode(errors="replace"),
                   partition=partition, max_jobs=self.max_jobs,
                   note="the job table is full: the job that showed nothing but a run-start "
                        "for longest made room for a new one")
        return True

    def save(self, key: bytes, st: JobState, partition: int, p: PartitionCache, durable: bool,
             now: float) -> None:
        p.cache[key] = st
        p.touched[key] = now
        p.broken.discard(key)
        job_table.note(p, key, st)
        if st.phase in ACTIVE:
            if key not in p.active:
                p.active.add(key)
                p.watch(key, now)
            p.finished.pop(key, None)
        else:
            p.active.discard(key)
            p.ended.add(key)
            if key in self.guard.held or key in self.guard.lapsed:
                self.guard.drop(key)
            self._finished(key, p, now)
        (p.settling.add if st.phase == Phase.SETTLING else p.settling.discard)(key)
        if key not in p.dirty:
            p.dirty.add(key)
            heapq.heappush(p.write_due, (p.written.get(key, 0.0) + WRITE_BEHIND_S, key))
        if durable:
            if self._batch_writes is not None:
                self._batch_writes[key] = (partition, p)
            else:
                self._write(key, partition, p, now)

    def _write(self, key: bytes, partition: int, p: PartitionCache, now: float) -> None:
        st = p.cache.get(key)
        p.dirty.discard(key)
        if st is None:
            return
        d = st.to_dict()
        d[PARTITION_FIELD] = partition
        # an exact-size copy: orjson's result keeps its whole output buffer (8 kB and more
        # for a 1 kB state), and the table holds every job's bytes for as long as it lives
        raw = bytes(memoryview(orjson.dumps(d)))
        self.store.put(partition, key, raw)
        p.written[key] = now
        self.metrics.count("table_writes")
        self.metrics.count("table_bytes", len(raw))

    def flush(self, now: float) -> int:
        """Write every dirty (write-behind) state now; returns how many."""
        n = 0
        for partition, p in list(self.parts.items()):
            for key in list(p.dirty):
                self._write(key, partition, p, now)
                n += 1
        return n

    @property
    def dirty(self) -> int:
        return sum(len(p.dirty) for p in self.parts.values())

    # ---- assignment ---------------------------------------------------------------------

    def on_assigned(self, partitions: Iterable[int]) -> None:
        """Caches are rebuilt (and the node-lost grace restarts) on the first record after
        an assignment: the states may have moved or been recovered meanwhile."""
        self.parts.clear()

    def on_revoked(self, partitions: Iterable[int], now: float) -> int:
        """Write the dirty states of every partition (they go with the partitions), then
        drop the caches; returns how many states were written."""
        n = self.flush(now)
        self.parts.clear()
        return n
