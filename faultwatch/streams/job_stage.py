"""The job stage: signals records in, decisions out. Per-partition job states with a
write-behind cache over a store (the Faust table, or a dict in embedded mode); one bad
record or one broken job state never stops a batch, a tick or the other jobs."""

from __future__ import annotations

import heapq
from collections import deque
from collections.abc import Callable, Iterable, Sequence

import orjson

from faultwatch.core.blast import GUARDED_ACTIONS, GUARDED_KINDS, BlastGuard, Census
from faultwatch.core.events import (
    Decision,
    Heartbeat,
    Output,
    Progress,
    ProgressBatch,
    RunStart,
    Signal,
)
from faultwatch.core.holds import Hold, hold_decisions
from faultwatch.core.job import JobState, apply_batch, new_state, tick
from faultwatch.core.ledger import Ledger
from faultwatch.core.membership import NO_ANSWERS, Allocations
from faultwatch.core.quota import NodeQuota
from faultwatch.core.timeline import fold_job
from faultwatch.eventlog import Quiet, log_event
from faultwatch.streams.allocations import requests
from faultwatch.streams.counters import Metrics
from faultwatch.streams.job_states import (  # noqa: F401 - used and re-exported
    ACTIVE,
    FINISHED_TTL_S,
    JOB_IDLE_S,
    LIVENESS_WRITES_MAX_PER_S,
    MAX_JOBS,
    PARTITION_FIELD,
    WRITE_BEHIND_S,
    DictStore,
    JobStates,
    PartitionCache,
    StateStore,
    earliest_seen,
)
from faultwatch.streams.records import DeadLetter, InRecord, LiveRules
from faultwatch.streams.storm import (
    CENSUS_REUSE_S,
    census,
    guarded,
    heartbeat_gap_s,
    hold_policy,
    last_output,
    log_guard,
    notice_decision,
)
from faultwatch.trust.refusals import REFUSALS
from faultwatch.trust.replay import DEFAULT_MAX_AGE_S
from faultwatch.wire import MAX_RECORD_BYTES, Tick, decode_signals, job_key
from faultwatch.wire.decisions import bounded_decision  # noqa: F401 - used and re-exported

TICK_S = 0.5  # how often the shell sends a tick to each signals partition it owns
CAUGHT_UP_S = 2.0  # a tick older than this when processed: the partition is lagging
TICK_GAP_S = 4 * TICK_S + CAUGHT_UP_S  # no tick for this long: the clock was not watching
GRACE_S = 5.0  # extra grace (beyond node_lost_s) after assignment/recovery before node-lost
LIVENESS = (Output, Heartbeat, Progress, ProgressBatch)
EVICT_SWEEP_S = 5.0  # how often a partition's tick looks for idle cached states
MAX_RETIRED_LEDGERS = 1024  # ledgers of runs replaced by a new run, held for the publisher


REFUSED_RUN = ("other-run", "not-allocated", "name-in-use")  # a node about a run not its
QUIET_EVENTS = ("job_evicted", "run_start_refused", "decision_withheld")


def count_refusals(before: JobState, after: JobState) -> None:
    """Records a node sent about a run it is not in (core/runs.py): counted in
    faultwatch_refused_total{what="run"} (the job state keeps its own counts)."""
    for reason in REFUSED_RUN:
        n = after.dropped.get(reason, 0) - before.dropped.get(reason, 0)
        if n > 0:
            REFUSALS[("run", reason.replace("-", "_"))] += n


class JobStage(JobStates):
    """Signals records -> decisions, per signals partition.

    Lifecycle signals and decisions write the job's state through to the store at once;
    liveness signals (output, heartbeats, progress) of big jobs arrive constantly, so they
    only mark the job dirty and a tick of its partition writes it at most every
    write_behind_s() (5 s, longer beyond 1,000 active jobs). flush() writes every dirty
    state (revocation, stop). A tick record (`{"t": "tick", "now": sent}`) advances
    processor time for its partition.
    """

    def __init__(self, live: LiveRules, store: StateStore, dead_letter: DeadLetter,
                 metrics: Metrics | None = None, max_record_bytes: int = MAX_RECORD_BYTES,
                 max_jobs: int = MAX_JOBS, finished_ttl_s: float = FINISHED_TTL_S,
                 max_decision_age_s: float = DEFAULT_MAX_AGE_S) -> None:
        self.live = live
        self.store = store
        self.dead_letter = dead_letter
        self.metrics = metrics or Metrics()
        self.max_record_bytes = max_record_bytes
        self.parts: dict[int, PartitionCache] = {}
        self.logs_caught_up = True  # set by the shell: its logs partitions have no backlog
        self.node_lost = True  # False: processor time never declares a node lost
        # signals of a record in, signals to apply out (faultwatch.registry.gate.NodeGate)
        self.gate: Callable[[list[Signal], float], list[Signal]] | None = None
        # during process_batch: durable writes held to its end (key -> partition, cache)
        self._batch_writes: dict[bytes, tuple[int, PartitionCache]] | None = None
        self.max_jobs = max_jobs  # active jobs per worker (MAX_JOBS)
        self.finished_ttl_s = finished_ttl_s  # decided/done jobs leave the table (FINISHED_TTL_S)
        # a decision about evidence older than this is not published (the consumers' replay
        # rule: they would refuse it; a processor reading history must not re-sign it)
        self.max_decision_age_s = max_decision_age_s
        self._refusing = False  # at the cap: logged once per state change
        self.guard = BlastGuard()  # many jobs lost or hung together: hold (core/blast.py)
        # (job, now) -> the operator's hold in force on it (holds.table.HoldsTable.hold_of)
        self.holds: Callable[[str, float], Hold | None] | None = None
        self._census: tuple[float, Census] | None = None
        # the scheduler's allocations for the batch (core/membership.py), set by the shell
        # from streams/allocations.py before process_batch; empty: runs are not checked
        self.answers: Allocations = NO_ANSWERS
        # new jobs and run-starts per node a minute (core/quota.py); None: no quota. The
        # shell gives the same quota to its node gate (the run-starts)
        self.quota: NodeQuota | None = None
        # repeated refusals and evictions: the first of each kind in full, then a count
        self.quiet = Quiet(log_event, QUIET_EVENTS)
        self._released, self._released_at = 0, float("-inf")  # states freed since a release
        # the last ledgers of runs a new run replaced (streams/incident_publish.py takes them)
        self.retired_ledgers: deque[Ledger] = deque(maxlen=MAX_RETIRED_LEDGERS)

    # ---- batches ------------------------------------------------------------------------

    def process_batch(self, records: Iterable[InRecord], now: float) -> list[Decision]:
        """Decisions of a batch of signals records (ticks included).

        Each job is folded once per batch: its signals from every record of the batch, in
        order, with one state read and one write (a tick of its partition is a barrier: it
        sees every signal before it). A record whose signals raise is dead-lettered and its
        job's other records are folded without it (each alone), as if it had come alone."""
        out: list[Decision] = []
        self._batch_writes = {}  # durable writes wait for the batch's end: one per job
        # per partition: job key -> its records' (record, signals), in order of first record
        held: dict[int, dict[str, list[tuple[InRecord, list[Signal]]]]] = {}
        try:
            for rec in records:
                try:
                    sigs = decode_signals(rec.value)
                except Exception as e:  # noqa: BLE001 - one bad record never stops the stage
                    self._dead(rec, e)
                    continue
                if isinstance(sigs, Tick):
                    out += self._fold_held(rec.partition, held.pop(rec.partition, {}), now)
                    try:
                        out += self._tick(rec.partition, sigs.now, now)
                    except Exception as e:  # noqa: BLE001
                        self._dead(rec, e)
                elif sigs:
                    jobs = held.setdefault(rec.partition, {})
                    jobs.setdefault(sigs[0].job, []).append((rec, sigs))
            for partition, jobs in held.items():
                out += self._fold_held(partition, jobs, now)
        finally:
            self._write_batch(now)
            self._batch_writes = None
        return out + self._notices()  # the guard's notices and gauges once per batch

    def _fold_held(self, partition: int, jobs: dict[str, list[tuple[InRecord, list[Signal]]]],
                   now: float) -> list[Decision]:
        """Fold each job's held records at once; records of a job whose fold raises are
        folded again one by one (the one that raises is dead-lettered)."""
        out: list[Decision] = []
        for recs in jobs.values():
            if len(recs) > 1:
                try:
                    out += self._fold(partition, [s for _, sigs in recs for s in sigs], now)
                    continue
                except Exception:  # noqa: BLE001 - find the record that raises
                    pass
            for rec, sigs in recs:
                try:
                    out += self._fold(partition, sigs, now)
                except Exception as e:  # noqa: BLE001 - one bad record never stops the stage
                    self._dead(rec, e)
        return out

    def _dead(self, rec: InRecord, err: Exception) -> None:
        self.metrics.dead_letters += 1
        self.dead_letter(rec, err)

    def _write_batch(self, now: float) -> None:
        pending = self._batch_writes
        if pending:
            for key, (partition, p) in list(pending.items()):
                if key in p.dirty:
                    self._write(key, partition, p, now)
            pending.clear()

    def fold(self, partition: int, sigs: list[Signal], now: float) -> list[Decision]:
        """Apply one record's signals in order, all or nothing: if one raises, no state of
        this record is kept and its decisions are not published (the caller dead-letters).
        The guard's notices follow the record's decisions."""
        return self._fold(partition, sigs, now) + self._notices()

    def _fold(self, partition: int, sigs: list[Signal], now: float) -> list[Decision]:
        p = self.partition(partition, now)
        self.metrics.jobs_signals += len(sigs)
        if self.gate is not None:
            sigs = self.gate(sigs, now)
        live = self.live
        staged: dict[bytes, tuple[JobState, JobState | None, bool]] = {}  # key -> new, old, durable
        decs: list[Decision] = []
        i, n = 0, len(sigs)
        while i < n:  # runs of one job's signals (a bundle is one job) folded at once
            job = sigs[i].job
            j = i + 1
            while j < n and sigs[j].job == job:
                j += 1
            group = sigs[i:j]
            i = j
            key = job_key(job)
            if key in staged:
                st, old, durable = staged[key]
            else:
                old = self.load(key, p)
                durable = False
                if old is None:  # only a run-start starts a job's state (no phantom jobs)
                    first = next((k for k, sig in enumerate(group)
                                  if isinstance(sig, RunStart)), len(group))
                    if first:
                        self.metrics.count("dropped.no-run", first)
                    group = group[first:]
                    fresh = new_state(group[0]) if group else None
                    if fresh is None:
                        continue
                    first_start = group[0]
                    assert isinstance(first_start, RunStart)
                    if not self.new_job_allowed(first_start, now) or self.refuse(job, now):
                        continue
                    st = fresh
                else:
                    st = old
            prev = st
            guard = self.guard
            held = guard.held.get(key) if old is not None else None
            if held is not None and held[2] == "node-lost":  # a held job reports again
                guard.returned(key, now, heartbeat_gap_s(old, group))
                p.watch(key, now)
            st, new_decs = apply_batch(st, group, now, live.policy, live.rules_version,
                                       self.answers)
            if st.dropped is not prev.dropped:
                count_refusals(prev, st)
                if old is None and not st.nodes and not st.run_ids:
                    continue  # its run-start was refused: no job (no phantom)
            if held is not None and held[2] != "node-lost" and last_output(st) > last_output(prev):
                guard.returned(key, now)  # a held hang: its output resumed
            g = guarded(new_decs, GUARDED_KINDS, GUARDED_ACTIONS) if new_decs else None
            if g is not None and not self._consider(key, partition, g, now):
                st, new_decs = apply_batch(prev, group, now, hold_policy(live.policy),
                                           live.rules_version, self.answers)
            if new_decs and self.holds is not None:  # an operator's hold: notices only
                st, new_decs = hold_decisions(prev, st, new_decs, self.holds(job, now), now)
            st = self.account(prev, st, group, new_decs)
            if st is not prev:
                durable = durable or bool(new_decs) or st.phase != prev.phase \
                    or st.attempt != prev.attempt \
                    or any(not isinstance(sig, LIVENESS) for sig in group)
            staged[key] = (st, old, durable)
            decs += new_decs
        for key, (st, old, durable) in staged.items():
            if st is not old:
                self.save(key, st, partition, p, durable, now)
        return self.fresh([bounded_decision(d, self.max_record_bytes) for d in decs], now)

    # ---- membership: the scheduler's allocations ----------------------------------------

    def allocation_requests(self, records: Iterable[InRecord]) -> list[tuple[str, str]]:
        """What the shell asks the scheduler before process_batch (allocations.requests)."""
        return requests(records, self.peek)

    def peek(self, key: bytes, partition: int) -> JobState | None:
        """A job's state (cached or stored) without caching it; None if none or unreadable."""
        p = self.parts.get(partition)
        st = p.cache.get(key) if p is not None else None
        if st is not None:
            return st
        raw = self.store.get(key)
        try:
            return JobState.from_dict(orjson.loads(raw)) if raw else None
        except Exception:  # noqa: BLE001 - a broken state is the tick's to report
            return None

    # ---- the age of decisions -----------------------------------------------------------

    def fresh(self, decs: list[Decision], now: float) -> list[Decision]:
        """The decisions whose evidence is within max_decision_age_s: an older one is made
        (the job's state moves on, its id is remembered) but not published, counted and
        logged (quietly): a new consumer group reading the logs topic from its start, or a
        node's own old records sent again, re-decide history, which no one may act on."""
        if not decs:
            return decs
        horizon = now - self.max_decision_age_s
        kept = [d for d in decs if d.ts >= horizon]
        if len(kept) < len(decs):
            for d in decs:
                if d.ts < horizon:
                    self.metrics.count("decisions_withheld")
                    self.quiet("decision_withheld", reason="too_old", id=d.id, job=d.job,
                               action=d.action, kind=d.kind, age_s=round(now - d.ts, 1),
                               max_age_s=self.max_decision_age_s)
        return kept

    # ---- goodput ------------------------------------------------------------------------

    def account(self, prev: JobState | None, st: JobState, sigs: Sequence[Signal],
                decs: Sequence[Decision]) -> JobState:
        """`st` with its run's ledger folded (core/timeline.py: attempts, incidents, progress
        in event time). A run this record replaced leaves its last ledger to publish."""
        if prev is not None and prev.run_id != st.run_id and prev.ledger.attempts:
            self.retired_ledgers.append(prev.ledger)
        return fold_job(prev, st, sigs, decs)

    # ---- the blast-radius guard ---------------------------------------------------------

    def _consider(self, key: bytes, partition: int, dec: Decision, now: float) -> bool:
        """The guard's word on a lost/hung decision: True acts, False holds it."""
        def count() -> Census:
            c = self._census
            if c is None or now - c[0] >= CENSUS_REUSE_S or now < c[0]:
                self._census = c = (now, census(self.parts.values(), now, self.live.policy))
            return c[1]
        # a census is reused for CENSUS_REUSE_S even after a job was acted on: the guard
        # counts the jobs it let act (`recent`) with the silent ones, once each, so a stale
        # census counts the same; counting afresh after each of 10,000 node-lost decisions
        # of one tick took the worker's loop for minutes
        return self.guard.consider(key, partition, dec.kind, dec.action, now,
                                   self.live.policy, count, dec.nodes)

    def _notices(self) -> list[Decision]:
        self.quiet.tick()
        notices = self.guard.take_notices()
        if notices or self.guard.ended:
            log_guard(self.guard, notices)
        m = self.metrics
        m.storm = self.guard.state()
        m.jobs_active = sum(len(p.active) for p in self.parts.values())
        m.jobs_cached = sum(len(p.cache) for p in self.parts.values())
        m.jobs_finished = sum(len(p.finished) for p in self.parts.values())
        m.max_jobs = self.max_jobs
        return [notice_decision(n, self.live.policy, self.live.rules_version)
                for n in notices]

    # ---- processor time -----------------------------------------------------------------

    def tick(self, partition: int, sent: float, now: float) -> list[Decision]:
        """Advance processor time on one partition: write-behind, settle fallbacks, node-lost
        (only when the clock may be trusted). A job whose tick raises is set aside (logged
        once), never retried on every tick, and the partition's other jobs go on. The
        guard's notices follow the tick's decisions."""
        return self._tick(partition, sent, now) + self._notices()

    def _tick(self, partition: int, sent: float, now: float) -> list[Decision]:
        p = self.partition(partition, now)
        lag = max(0.0, now - sent)
        self.metrics.tick_lag_s[partition] = round(lag, 3)
        behind_s = self.write_behind_s()
        while p.write_due and p.write_due[0][0] <= now:
            _, key = heapq.heappop(p.write_due)
            if key not in p.dirty:
                continue  # written meanwhile (durable)
            when = p.written.get(key, 0.0) + behind_s
            if when <= now:
                self._write(key, partition, p, now)
            else:
                heapq.heappush(p.write_due, (when, key))
        # processor time is trusted for node-lost only when this partition is caught up (the
        # tick came through the topic quickly), the shell's logs partitions are too (a node's
        # heartbeats may wait in their backlog), and every node had a full window to show
        # itself since then or since the partition was assigned or recovered. A lagging
        # partition or logs backlog, or ticks that stopped (broker outage, a stalled loop),
        # restarts the grace.
        if lag >= CAUGHT_UP_S or not self.logs_caught_up \
                or (p.last_tick is not None and now - p.last_tick > TICK_GAP_S):
            p.since = now
        p.last_tick = now
        live = self.live
        if now - p.swept >= EVICT_SWEEP_S:
            self.evict_idle(partition, p, now)
            self.expire_finished(partition, p, now)
        guard = self.guard
        guard.step(now, live.policy)
        for key, part in guard.release_due(now, live.policy):  # the hold's fallback
            q = self.parts.get(part)
            if q is not None and key in q.active:
                q.lost_queued.discard(key)
                q.watch(key, float("-inf"))
            else:
                guard.drop(key)
        live_clock = self.node_lost and now - p.since >= live.policy.node_lost_s + GRACE_S
        caught_up = lag < CAUGHT_UP_S and self.logs_caught_up
        out: list[Decision] = []
        due = set(p.settling)  # the settle fallback
        if live_clock and live.policy.node_lost_detection:
            horizon = now - live.policy.node_lost_s
            while p.lost_due and p.lost_due[0][0] <= horizon:
                _, key = heapq.heappop(p.lost_due)
                p.lost_queued.discard(key)
                if key not in p.active:
                    continue  # decided or done since it was queued
                if key in guard.held or (key in guard.lapsed
                                         and key not in guard.lapsed_decided):
                    continue  # held: re-watched when it returns or its turn comes
                st = p.cache.get(key)
                if st is None:
                    due.add(key)  # not cached: the tick below loads it
                    continue
                first = earliest_seen(st)
                if first is not None and first <= horizon:
                    due.add(key)  # a live node is silent for the window: may be lost
                elif st.phase in ACTIVE:
                    p.watch(key, now if first is None else first)
        for key in due:
            try:
                st = self.load(key, p)
                if st is None:
                    p.active.discard(key)
                    p.settling.discard(key)
                    continue
                st2, decs = tick(st, now, live.policy, live.rules_version,
                                 live_clock=live_clock, caught_up=caught_up)
                g = guarded(decs, GUARDED_KINDS, GUARDED_ACTIONS) if decs else None
                if g is not None and not self._consider(key, partition, g, now):
                    if key not in guard.held and key not in guard.lapsed:
                        p.watch(key, now)  # returned from a hold just now: checked again
                    continue  # held: the state stays undecided
                if decs and self.holds is not None:  # an operator's hold: notices only
                    st2, decs = hold_decisions(st, st2, decs, self.holds(st.job, now), now)
                st2 = self.account(st, st2, (), decs)
                if st2 is not st:
                    self.save(key, st2, partition, p, True, now)
                    if st2.phase in ACTIVE:  # still running (a spare lost): watched on
                        p.watch(key, earliest_seen(st2) or now)
                elif st.phase not in ACTIVE:
                    p.active.discard(key)
                    p.settling.discard(key)
                elif key in p.active:
                    p.watch(key, earliest_seen(st) or now)
                out += [bounded_decision(d, self.max_record_bytes) for d in decs]
            except Exception as e:  # noqa: BLE001 - one broken state never stops a tick
                p.active.discard(key)
                p.settling.discard(key)
                p.broken.add(key)
                self.metrics.count("jobs_broken")
                log_event("job_tick_failed", job=key.decode(errors="replace"),
                          partition=partition, error=f"{type(e).__name__}: {e}")
        return self.fresh(out, now)
