"""Following the decisions topic for one job, and what a decision means for this node."""

from __future__ import annotations

import asyncio
import collections
import contextlib
import random
import time
import uuid
from collections.abc import Callable
from typing import Any

from faultwatch import wire
from faultwatch.core.events import Decision
from faultwatch.errors import DecodeError
from faultwatch.eventlog import Quiet
from faultwatch.kafka import clients
from faultwatch.trust.decisions import decision_verifier
from faultwatch.trust.intake import DecisionIntake, fresh
from faultwatch.trust.records import DecisionGate
from faultwatch.trust.replay import BEFORE_START, ReplayGuard, max_age_s, run_matches

QUIET_EVENTS = ("decision_refused", "decision_other_run", "undecodable_decision")

Log = Callable[..., None]

# What the agent does about a decision (None: not for this node / nothing to do).
RESTART, BLACKLISTED, FAIL, NOTIFY = "restart", "blacklisted", "fail", "notify"
REPLACED = "replaced"  # a hot spare takes this node's place (decision.swaps): leave
START_MARGIN_S = 5.0  # also read decisions stamped this long before the start (clock skew)
STALE_AFTER_S = 6.0  # no fetch answer for this long: the broker is unreachable
MAX_BACKOFF_S = 10.0  # reconnect attempts while the broker is down: at most this far apart
TOPIC_POLL_S = 1.0  # how often to look for a decisions topic that does not exist yet


def verdict(dec: Decision, node: str, attempt: int) -> str | None:
    """This node's action for dec, or None when dec is not for (this attempt of) this node.

    restart: in sync mode the decision names every node of the job, in async mode only the
    failed ones; an empty node list means the whole job. blacklist: the named node exits
    (BLACKLISTED), the nodes in evidence.restart_nodes restart. fail: every node stops.
    A node a hot spare replaces (decision.swaps) leaves: REPLACED, whatever else it says."""
    if dec.attempt != attempt:
        return None
    if dec.action in ("restart", "blacklist") and any(a == node for a, _ in dec.swaps):
        return REPLACED
    nodes = {n for n in dec.nodes if isinstance(n, str)}
    if dec.action == "restart":
        return RESTART if not dec.nodes or node in nodes else None
    if dec.action == "blacklist":
        if node in nodes:
            return BLACKLISTED
        others = dec.evidence.get("restart_nodes") if isinstance(dec.evidence, dict) else None
        return RESTART if isinstance(others, list) and node in others else None
    if dec.action == "fail":
        return FAIL
    if dec.action == "notify":
        return NOTIFY
    return None


def run_id_to_match(cfg: Any) -> str:
    """The run id a decision must name to concern this agent: always this agent's own,
    generated ids too (the job stage lists the generated ids it folded into one run in the
    decision's `run_ids`), so a decision about another run of the job never acts here."""
    return str(cfg.run_id)


def replay_state_file(cfg: Any) -> Any:
    """Where the agent keeps the ids of the decisions it acted on (beside its spool)."""
    return cfg.spool_path / "decisions-seen.jsonl"


class DecisionFollower:
    """A group-less consumer of <prefix>decisions keeping the records keyed by one job.

    Positioning cannot miss a decision published after start(): it takes the partitions'
    end offsets first and then looks up the offset for (start time - margin); it reads from
    the smaller of the two, so a record landing between the two lookups is read, whatever
    its timestamp. A topic that does not exist yet is read from its beginning once it
    appears. `ready` is set once positioned (or once the topic is known not to exist): the
    supervisor waits for it, bounded, before the child starts.

    While the broker is unreachable the consumer is closed and retried with exponential
    back-off (at most MAX_BACKOFF_S apart); one event is logged per state change. On
    reconnection it resumes from the offsets it had reached. Decisions are deduplicated by
    id and queued for get(); a record that does not decode is logged (partition, offset)
    and skipped."""

    def __init__(self, bootstrap: str, topic: str, job: str, log: Log,
                 consumer_factory: Callable[..., Any] | None = None, run_id: str = "",
                 replay: ReplayGuard | None = None, gate: DecisionGate | None = None):
        self.bootstrap, self.topic, self.job = bootstrap, topic, job
        self.run_id = run_id  # decisions about another run of the job are refused
        self.key = wire.job_key(job)
        self.start_ts = time.time()
        self.ready = asyncio.Event()  # assigned and positioned (or the topic is absent)
        self.bad_records = 0
        # refusals are counted, not a line each: this log is the training job's stderr
        self._log = self.quiet = Quiet(log, QUIET_EVENTS)
        self._factory = consumer_factory
        # refuses forged decisions; one gate per agent, so its warning is logged once
        self.gate = gate or DecisionGate(decision_verifier(), self.quiet)
        # the replay rule: once, this run, within the maximum age (docs/decisions.md)
        self.replay = replay or ReplayGuard("decision", max_age_s(), log=log)
        self._seen: set[str] = set()
        self._pending: collections.deque[Decision] = collections.deque()
        self._arrived = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._next: dict[int, int] = {}  # partition -> next offset to read
        self._topic_was_absent: bool | None = None  # at the first look
        self._state = ""
        self._stopping: set[asyncio.Future[Any]] = set()

    def start(self) -> None:
        self.gate.announce()
        self._task = asyncio.create_task(self._run(), name="faultwatch-decisions")

    async def wait_ready(self, timeout_s: float) -> bool:
        """Wait (bounded) until positioned; False (logged) when the broker did not answer."""
        try:
            await asyncio.wait_for(self.ready.wait(), timeout_s)
            return True
        except TimeoutError:
            self._log("decisions_not_ready", waited_s=timeout_s,
                      note="starting anyway; decisions since the start are read on reconnect")
            return False

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._task
        self.quiet.flush()

    async def get(self, timeout: float | None = None) -> Decision | None:
        """The next new decision for the job, or None after timeout seconds (cancel-safe:
        a decision is never lost by a cancelled or timed-out get)."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while not self._pending:
            self._arrived.clear()
            left = None if deadline is None else deadline - time.monotonic()
            if left is not None and left <= 0:
                return None
            try:
                await asyncio.wait_for(self._arrived.wait(), left)
            except TimeoutError:
                return None
        return self._pending.popleft()

    def get_nowait(self) -> Decision | None:
        return self._pending.popleft() if self._pending else None

    def offer(self, d: dict[str, Any] | Decision) -> None:
        """Queue a decision (or a decoded decision dict) unless its id was seen."""
        if isinstance(d, Decision):
            dec = d
        else:
            try:
                dec = wire.decision_of(d)
            except DecodeError as e:
                self._bad(None, None, str(e))
                return
        if dec.job != self.job or dec.id in self._seen:
            return
        self._seen.add(dec.id)
        if self.run_id:
            why = run_matches({self.run_id}, dec.run_id, dec.run_ids)
            if why is not None:
                self.replay.refuse_run(why)
                self._log("decision_refused", reason=why, id=dec.id, run_id=dec.run_id,
                          ours=self.run_id, action=dec.action)
                return
        if time.time() - self.replay.max_age_s <= dec.ts < self.start_ts - START_MARGIN_S:
            # its evidence predates this agent: about an earlier run or attempt (a derived
            # run id launched again names both), never about the child this agent runs
            self.replay.refuse_run(BEFORE_START)
            self._log("decision_refused", reason=BEFORE_START, id=dec.id, action=dec.action,
                      age_s=round(time.time() - dec.ts, 1),
                      started_s_ago=round(time.time() - self.start_ts, 1))
            return
        if not fresh(self.replay, dec, time.time(), self._log):
            return
        self._pending.append(dec)
        self._arrived.set()

    def _bad(self, partition: int | None, offset: int | None, error: str) -> None:
        self.intake.undecodable(error, topic=self.topic, partition=partition, offset=offset)

    @property
    def intake(self) -> DecisionIntake:
        """The one decision intake, over this follower's gate and replay rule (both may be
        replaced after construction)."""
        return DecisionIntake(self.gate, self.replay, self._count_bad)

    def _set_state(self, state: str, **kv: Any) -> None:
        """Log a state change once (following, waiting_for_topic, unavailable)."""
        if state != self._state:
            self._state = state
            self._log(f"decisions_{state}", topic=self.topic, **kv)

    async def _run(self) -> None:
        backoff = 0.5
        while True:
            healthy = False
            try:
                healthy = await self._session()
            except asyncio.CancelledError:
                raise
            except Exception as e:  # noqa: BLE001 - broker down: retry, never crash the agent
                self._set_state("unavailable", error=repr(e)[:300])
            else:
                self._set_state("unavailable", error="no answer from the broker for "
                                f"{STALE_AFTER_S:.0f}s")
            if healthy:
                backoff = 0.5
            await asyncio.sleep(backoff * random.uniform(0.8, 1.2))
            backoff = min(backoff * 2, MAX_BACKOFF_S)

    def _consumer(self) -> Any:
        factory = self._factory or clients.consumer
        return factory(bootstrap_servers=self.bootstrap, group_id=None,
                       enable_auto_commit=False, request_timeout_ms=15000,
                       auto_offset_reset="earliest",  # an offset gone by retention
                       client_id=f"faultwatch-agent-decisions-{uuid.uuid4().hex[:6]}")

    async def _session(self) -> bool:
        """One consumer's life: connect, position, read until the broker stops answering.
        Returns whether it got as far as reading (so the back-off starts afresh)."""
        c = self._consumer()
        try:
            await asyncio.wait_for(c.start(), 20)
            parts = await self._wait_for_topic(c)
            if parts is None:
                return False
            await self._position(c, parts)
            self.ready.set()
            self._set_state("following", partitions=len(parts))
            await self._read(c, parts)
            return True
        finally:
            await self._stop(c)

    async def _stop(self, c: Any) -> None:
        """Stop a consumer, waiting at most 5 s: aiokafka's stop() can hang (and ignore
        cancellation) while the broker is unreachable, so it finishes in the background."""
        stop = asyncio.ensure_future(c.stop())
        self._stopping.add(stop)
        stop.add_done_callback(self._stopping.discard)
        stop.add_done_callback(lambda t: t.cancelled() or t.exception())  # retrieve errors
        await asyncio.wait({stop}, timeout=5.0)

    async def _wait_for_topic(self, c: Any) -> list[int] | None:
        """The topic's partitions once it exists; None when the broker stopped answering."""
        while True:
            ok = await asyncio.wait_for(c._client.force_metadata_update(),  # noqa: SLF001
                                        STALE_AFTER_S)
            if not ok:
                return None
            parts = sorted(c.partitions_for_topic(self.topic) or ())
            if self._topic_was_absent is None:
                self._topic_was_absent = not parts
            if parts:
                return parts
            # The processor creates the topic; everything in it will postdate our start.
            self.ready.set()
            self._set_state("waiting_for_topic")
            await asyncio.sleep(TOPIC_POLL_S)

    async def _position(self, c: Any, parts: list[int]) -> None:
        from aiokafka import TopicPartition  # type: ignore[import-untyped,unused-ignore]

        tps = [TopicPartition(self.topic, p) for p in parts]
        c.assign(tps)
        new = [tp for tp in tps if tp.partition not in self._next]
        if new and self._topic_was_absent:
            for tp, o in (await c.beginning_offsets(new)).items():
                self._next[tp.partition] = o
        elif new:
            ends = await c.end_offsets(new)  # first: a record after this is always read
            since_ms = int((self.start_ts - START_MARGIN_S) * 1000)
            by_time = await c.offsets_for_times({tp: since_ms for tp in new})
            for tp in new:
                found = by_time.get(tp)
                self._next[tp.partition] = min(ends[tp], found.offset) if found else ends[tp]
        for tp in tps:
            c.seek(tp, self._next[tp.partition])

    async def _read(self, c: Any, parts: list[int]) -> None:
        from aiokafka import TopicPartition  # type: ignore[import-untyped,unused-ignore]

        tps = [TopicPartition(self.topic, p) for p in parts]
        since = time.time()
        while True:
            batch = await c.getmany(timeout_ms=500)
            for tp, msgs in batch.items():
                for m in msgs:
                    self._next[tp.partition] = m.offset + 1
                    if m.key == self.key:
                        self._take(m)
            polled = [c.last_poll_timestamp(tp) for tp in tps]
            last = max([p / 1000 for p in polled if p is not None] + [since])
            if time.time() - last > STALE_AFTER_S:
                return

    def _take(self, m: Any) -> None:
        dec = self.intake.decode(m.value, topic=self.topic, partition=m.partition,
                                 offset=m.offset)
        if dec is not None:
            self.offer(dec)

    def _count_bad(self, event: str, **fields: Any) -> None:
        """The intake's log: an undecodable record is counted here too (bad_records)."""
        if event == "undecodable_decision":
            self.bad_records += 1
        self._log(event, **fields)
