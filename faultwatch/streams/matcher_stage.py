"""The matcher stage: a batch of logs records in, per-job signal bundles out (bounded in size),
bad records to the dead-letter callback. No Faust, no Kafka: the shell does the I/O."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import orjson

from faultwatch.core.events import Heartbeat, Notice, Output, Signal
from faultwatch.eventlog import log_event
from faultwatch.streams.budget import Episode, LineBudget
from faultwatch.streams.counters import Metrics
from faultwatch.streams.logs_to_signals import signals_of_record
from faultwatch.streams.records import DeadLetter, InRecord, LiveRules
from faultwatch.trust.nodesig import RefusedRecord
from faultwatch.wire import (
    MAX_RECORD_BYTES,
    LinesBatch,
    bundle_head_bytes,
    decode_logs,
    encode_bundles,
    job_key,
    signal_dict,
)
from faultwatch.wire.signals import cap_signal  # noqa: F401 - used and re-exported


def supersedes(later: Heartbeat, earlier: Heartbeat) -> bool:
    """`later` (the same node, attempt and run) says all `earlier` says: not older, and its
    last output not older (a job state folds last_output_ts with max, last_hb_ts with the
    latest), so the job state after both is the state after `later` alone."""
    if later.ts < earlier.ts:
        return False
    if earlier.last_output_ts is None:
        return True
    return later.last_output_ts is not None and later.last_output_ts >= earlier.last_output_ts


class MatcherStage:
    """Logs records -> signals records. Per batch, every signal a job's records imply goes
    out in the order of those records, in one bundle per job (several when one would pass
    the size bound), so each node's lines still precede its exit on the signals topic."""

    def __init__(self, live: LiveRules, dead_letter: DeadLetter, metrics: Metrics | None = None,
                 max_record_bytes: int = MAX_RECORD_BYTES, node_verifier: Any = None,
                 budget: LineBudget | None = None) -> None:
        self.live = live
        # lines per node matched at most (streams/budget.py); past it, counted and announced
        self.budget = budget or LineBudget(0)
        # trust.nodesig.NodeVerifier: a record must be signed by the key of the node it names
        self.node_verifier = node_verifier
        self.dead_letter = dead_letter
        self.metrics = metrics or Metrics()
        self.max_record_bytes = max_record_bytes
        self.logs_lag_s: dict[int, float] = {}  # event-time lag of the latest record, by partition
        # the offset after the latest record processed, by partition: with the partition's high
        # watermark it says whether records wait (the consumer's own position is where its
        # fetcher is, which runs ahead of what the stage has processed)
        self.logs_next_offset: dict[int, int] = {}
        self._heartbeat: Heartbeat | None = None  # the record signal_dicts read, if one

    def process_batch(self, records: Iterable[InRecord], now: float) -> list[tuple[bytes, bytes]]:
        """The (key, value) signals records for a batch of logs records, in send order.

        Heartbeats fold into a liveness summary per job: within a run of a job's heartbeats
        (no other signal of the job between them), a node's later heartbeat replaces its
        earlier one. Nothing happened on that node in between (its lines would be a signal
        between them), and the job state after the run is the same; a backlog is read with
        one heartbeat per node instead of one per interval it lagged."""
        out: dict[str, list[bytes | None]] = {}
        runs: dict[str, dict[tuple[str, int, str], tuple[int, Heartbeat]]] = {}  # job -> run
        m = self.metrics
        done = self.logs_next_offset
        for rec in records:
            m.records += 1
            done[rec.partition] = rec.offset + 1
            try:
                dicts = self.signal_dicts(rec, now)
            except Exception as e:  # noqa: BLE001 - one bad record never stops the stage
                self._dead(rec, e)
                continue
            hb = self._heartbeat
            for job, raw in dicts:
                ds = out.setdefault(job, [])
                run = runs.setdefault(job, {})
                if hb is None:
                    run.clear()
                else:
                    hb_key = (hb.node, hb.attempt, hb.run_id)
                    prev = run.get(hb_key)
                    if prev is not None and supersedes(hb, prev[1]):
                        ds[prev[0]] = None  # superseded by this later heartbeat of the node
                        m.count("heartbeats_folded")
                    run[hb_key] = (len(ds), hb)
                ds.append(raw)
        sent: list[tuple[bytes, bytes]] = []
        for job, maybe in out.items():
            kept = [d for d in maybe if d is not None]
            m.signals += len(kept)
            for value in encode_bundles(job, kept, self.max_record_bytes):
                sent.append((job_key(job), value))
        m.signals_records += len(sent)
        return sent

    def signal_dicts(self, rec: InRecord, now: float) -> list[tuple[str, bytes]]:
        """(job, encoded capped signal dict) for one logs record; raises DecodeError on a
        record wire.decode_logs refuses and ValueError on a signal that cannot fit a record."""
        lr = decode_logs(rec.value)
        if self.node_verifier is not None:  # refused: dead-lettered with the reason
            try:
                self.node_verifier.check(lr.node, rec.value or b"", rec.headers)
            except RefusedRecord as e:  # whose record it was: that agent is told why
                e.about = (lr.job, lr.node, lr.attempt, lr.run_id)
                raise
        # the node a heartbeat record is about (its only signal), for process_batch's fold
        self._heartbeat = lr if isinstance(lr, Heartbeat) else None
        if isinstance(lr, LinesBatch) and lr.lines:
            self.metrics.lines += len(lr.lines)
            # (lines[-1] builds the last row's Line, every field checked: a record whose last
            # row is malformed is dead-lettered; the matcher reads only texts and times)
            self.metrics.logs_event_lag_s = now - lr.lines[-1].ts
            self.logs_lag_s[rec.partition] = self.metrics.logs_event_lag_s
        elif isinstance(lr, Heartbeat):
            self.logs_lag_s[rec.partition] = now - lr.ts
        sigs = self._throttled(lr) if isinstance(lr, LinesBatch) and lr.lines \
            and self.budget.rate > 0 else None
        if sigs is None:
            sigs = signals_of_record(lr, self.live.matcher)
        out = []
        for s in sigs:
            raw = orjson.dumps(cap_signal(signal_dict(s)))
            if len(raw) + bundle_head_bytes(s.job) > self.max_record_bytes:
                raise ValueError(f"a {type(s).__name__} signal of job {s.job!r} is {len(raw)} "
                                 f"bytes after capping (limit {self.max_record_bytes})")
            out.append((s.job, raw))
        return out

    def _throttled(self, lr: LinesBatch) -> list[Signal] | None:
        """None when the record's lines are within its node's budget (match them), else
        what a throttled record sends: its liveness (an Output without a tail: count, time)
        and, when an episode starts or ends, a `gap` notice (a notify decision)."""
        lines = lr.lines
        n = len(lines)
        ts = lines.times[-1]
        ok, episode = self.budget.take((lr.job, lr.node), n, ts)
        notes = [] if episode is None else [self._episode_note(lr, episode, ts)]
        if ok:
            if notes:  # an episode ended: its notice goes before the record's signals
                return [*notes, *signals_of_record(lr, self.live.matcher)]
            return None
        self.metrics.count("lines_throttled", n)
        out: list[Signal] = [Output(lr.job, lr.attempt, lr.node, ts, n,
                                    rank_last_ts=((lr.rank, ts),), run_id=lr.run_id)]
        return notes + out

    def _episode_note(self, lr: LinesBatch, ep: Episode, ts: float) -> Notice:
        rate = self.budget.rate
        if ep.started:
            self.metrics.count("nodes_throttled")
        log_event("node_throttled" if ep.started else "node_throttle_ended", job=lr.job,
                  node=lr.node, budget_lines_per_s=rate, lines_not_matched=ep.lines)
        reason = (f"over the matcher's budget of {rate:g} lines/s: lines past it are counted, "
                  "not matched" if ep.started else
                  f"under the matcher's budget of {rate:g} lines/s again after "
                  f"{ts - ep.since:.0f} s")
        return Notice(lr.job, lr.attempt, lr.node, ts, "gap",
                      {"reason": reason, "dropped_lines": ep.lines, "throttled": ep.started,
                       "budget_lines_per_s": rate}, lr.run_id)

    def _dead(self, rec: InRecord, err: Exception) -> None:
        self.metrics.dead_letters += 1
        self.dead_letter(rec, err)

    def on_assigned(self, partitions: Iterable[int]) -> None:
        """Lag is measured afresh on partitions this worker (re)gets."""
        for p in partitions:
            self.logs_lag_s.pop(p, None)
            self.logs_next_offset.pop(p, None)

    def on_revoked(self, partitions: Iterable[int]) -> None:
        for p in partitions:
            self.logs_lag_s.pop(p, None)
            self.logs_next_offset.pop(p, None)
