"""`faultwatch notify`: the thin Kafka shell around the grouping core and the senders
(webhooks; Alertmanager, whose alerts resolve from the status topic)."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx2

from faultwatch import wire
from faultwatch.core.diagnosis import is_probe
from faultwatch.errors import DecodeError
from faultwatch.holds.follow import follow_holds, holds_table
from faultwatch.holds.table import HoldsTable
from faultwatch.kafka import calm as broker_calm
from faultwatch.kafka import clients
from faultwatch.kafka.errors import diagnose
from faultwatch.notify.alertmanager import Alertmanager, AlertmanagerSender
from faultwatch.notify.alerts import AlertBook, AlertPolicy
from faultwatch.notify.grouping import Grouper, GroupingPolicy, Notification
from faultwatch.notify.http import HttpSecurity
from faultwatch.notify.limit import Digest, Limiter, RateLimits
from faultwatch.notify.sender import Receiver, RetryPolicy, deliver
from faultwatch.trust.intake import DecisionIntake
from faultwatch.trust.records import DecisionGate
from faultwatch.trust.replay import DEFAULT_MAX_AGE_S, ReplayGuard
from faultwatch.wire.topics import NOTIFY_GROUP

Log = Callable[..., None]
HOLDS_WAIT_S = 10.0  # at start, how long the mutes in force are waited for


@dataclass
class NotifierConfig:
    bootstrap: str
    topic: str
    receivers: tuple[Receiver, ...]
    group_id: str = NOTIFY_GROUP
    policy: GroupingPolicy = field(default_factory=GroupingPolicy)
    retry: RetryPolicy = field(default_factory=RetryPolicy)
    from_beginning: bool = False
    max_decision_age_s: float = DEFAULT_MAX_AGE_S
    replay_state: Path | None = None  # ids of decisions taken (the replay rule across restarts)
    limits: RateLimits = field(default_factory=RateLimits)
    alertmanagers: tuple[Alertmanager, ...] = ()
    alert_policy: AlertPolicy = field(default_factory=AlertPolicy)
    alertmanager_security: HttpSecurity = field(default_factory=HttpSecurity)
    status_topic: str | None = None  # where alerts learn that their job is healthy again
    holds_topic: str | None = None  # operators' mutes (`faultwatch jobs mute`), followed


class Notifier:
    """Consumes decisions with a consumer group, groups them, posts the due notifications.

    Offsets are committed only up to the first decision not yet delivered (or given up on),
    so a restarted notifier sends what a stopped one had not sent."""

    def __init__(self, cfg: NotifierConfig, gate: DecisionGate, log: Log,
                 clock: Callable[[], float] = time.time, holds: HoldsTable | None = None):
        self.cfg, self.gate, self.log, self.clock = cfg, gate, log, clock
        # the intake asks it whether a job is muted (holds.table.HoldsTable.muted); every
        # sink (webhooks, Alertmanagers) is behind that one check
        self.holds = holds if holds is not None else \
            (holds_table(log) if cfg.holds_topic else None)
        self.muted_ids: dict[str, int] = {}  # mute id -> decisions not posted under it
        self.grouper = Grouper(cfg.policy)
        self.replay = ReplayGuard("decision", cfg.max_decision_age_s, cfg.replay_state, log)
        self.intake = DecisionIntake(gate, self.replay, log)
        self.limiter = Limiter(cfg.limits, clock())
        self._where: dict[str, tuple[Any, int]] = {}  # decision id -> (tp, offset)
        self._inflight: dict[str, int] = {}  # decision id -> deliveries still running
        self._tasks: set[asyncio.Task[None]] = set()
        self._queues: dict[int, asyncio.Queue[Notification | Digest]] = {}
        self.sent = 0
        self._client: httpx2.AsyncClient | None = None  # the webhooks' (pooled)
        self.book = AlertBook(cfg.alert_policy) if cfg.alertmanagers else None
        self.alertmanagers = AlertmanagerSender(
            cfg.alertmanagers, cfg.alertmanager_security, cfg.retry, log,
            self._alerts_done) if cfg.alertmanagers else None
        self._am_inflight: dict[str, int] = {}  # decision id -> Alertmanagers still posting

    def _consumer(self) -> Any:
        return clients.consumer(
            self.cfg.topic, bootstrap_servers=self.cfg.bootstrap, group_id=self.cfg.group_id,
            enable_auto_commit=False,
            auto_offset_reset="earliest" if self.cfg.from_beginning else "latest",
            client_id="faultwatch-notify", **broker_calm.client_backoff())

    def take(self, value: bytes | None, tp: Any, offset: int) -> None:
        """One decisions-topic record: decode, check the signature, group."""
        where = {"topic": tp.topic, "partition": tp.partition, "offset": offset}
        dec = self.intake.decode(value, **where)
        if dec is None or is_probe(dec):  # an older processor's probe: machinery
            return
        if not self.intake.fresh(dec, self.clock(), **where):
            return
        raw = wire.decision_to_dict(dec)
        if self._muted(raw):  # before every sink: webhooks and Alertmanager alike
            return
        new = self.grouper.add(raw, self.clock()) if self.cfg.receivers else False
        if self.book is not None:
            self.book.add(raw, self.clock())
            new = True
        if new:
            self._where[str(raw.get("id", ""))] = (tp, offset)

    def _muted(self, raw: dict[str, Any]) -> bool:
        """A decision about a muted job is not posted: one line when a mute first holds one
        back, then counted (`notify_muted`); the offset moves on as for a posted one."""
        mute = self.holds.muted(str(raw["job"]), self.clock()) if self.holds else None
        if mute is None:
            return False
        n = self.muted_ids[mute.id] = self.muted_ids.get(mute.id, 0) + 1
        if len(self.muted_ids) > 1024:
            self.muted_ids = {mute.id: n}
        if n in (1, 10, 100) or n % 1000 == 0:
            self.log("notify_muted", job=raw["job"], by=mute.by, until=mute.until,
                     reason=mute.reason, held_back=n, id=raw["id"])
        return True

    def observe_status(self, value: bytes | None) -> None:
        """One status-topic record: resolve the alerts its job's snapshot shows healthy."""
        if self.book is None:
            return
        try:
            snap = wire.decode_status(value)
        except (DecodeError, KeyError, TypeError):
            return  # worker records and foreign records share the topic
        for key in self.book.observe(snap, self.clock()):
            self.log("alert_resolved", job=snap["job"], attempt=snap.get("attempt"),
                     phase=snap.get("phase"), alert=key.replace("\x1f", ","))

    def flush(self) -> None:
        """Queue the notifications that are due, each webhook within its rate limit (the
        rest become its digest), and the digests that are due."""
        now = self.clock()
        for note in self.grouper.due(now):
            for did in note.new_ids:
                self._inflight[did] = self._inflight.get(did, 0) + len(self.cfg.receivers)
            for i, receiver in enumerate(self.cfg.receivers):
                if self.limiter.admit(str(i), note, now):
                    self._queue(i).put_nowait(note)
                elif self.limiter.suppressed in (1, 10, 100) or \
                        self.limiter.suppressed % 1000 == 0:
                    self.log("notify_rate_limited", webhook=receiver.where,
                             held_back=self.limiter.suppressed,
                             digest_in_s=self.cfg.limits.digest_interval_s)
        for hook, dg in self.limiter.due_digests(now):
            self._queue(int(hook)).put_nowait(dg)
        if self.book is not None and self.alertmanagers is not None:
            due = self.book.due(now)
            if due.alerts:
                for did in due.ids:
                    self._am_inflight[did] = self._am_inflight.get(did, 0) + \
                        len(self.cfg.alertmanagers)
                self.alertmanagers.submit(due)

    def _alerts_done(self, ids: frozenset[str]) -> None:
        for did in ids:
            left = self._am_inflight.get(did, 1) - 1
            if left <= 0:
                self._am_inflight.pop(did, None)
            else:
                self._am_inflight[did] = left

    def _queue(self, i: int) -> asyncio.Queue[Notification | Digest]:
        q = self._queues.get(i)
        if q is None:
            q = self._queues[i] = asyncio.Queue()
            task = asyncio.create_task(self._sender(i, q))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)
        return q

    async def _sender(self, i: int, q: asyncio.Queue[Notification | Digest]) -> None:
        """One webhook's posts, one at a time, `min_gap_s` apart."""
        receiver = self.cfg.receivers[i]
        while True:
            note = await q.get()
            try:
                now = self.clock()
                while (wait := self.limiter.send_at(str(i), now) - now) > 0:
                    await asyncio.sleep(wait)
                    now = self.clock()
                self.limiter.sending(str(i), now)
                await self._deliver(receiver, note)
            finally:
                q.task_done()

    async def _deliver(self, receiver: Receiver, note: Notification | Digest) -> None:
        try:
            assert self._client is not None
            if await deliver(self._client, receiver, note, self.cfg.retry, self.log):
                self.sent += 1
        finally:
            for did in note.new_ids:
                left = self._inflight.get(did, 1) - 1
                if left <= 0:
                    self._inflight.pop(did, None)
                else:
                    self._inflight[did] = left

    def committable(self, positions: dict[Any, int]) -> dict[Any, int]:
        """Per partition: the offset of the first decision still pending or in flight, else
        the consumer's position."""
        waiting = self.grouper.pending_ids() | set(self._inflight) | set(self._am_inflight)
        if self.book is not None:
            for alert in self.book.alerts.values():
                waiting |= alert.ids
        for i in range(len(self.cfg.receivers)):
            dg = self.limiter.pending(str(i))
            if dg is not None:
                waiting |= dg.new_ids
        out = dict(positions)
        for did in waiting:
            if did in self._where:
                tp, offset = self._where[did]
                if tp in out:
                    out[tp] = min(out[tp], offset)
        for did in [d for d in self._where if d not in waiting]:
            del self._where[did]
        return out

    async def run(self, stop: asyncio.Event | None = None) -> None:
        """Consume until `stop` is set (or cancelled); deliveries in flight finish first."""
        stop = stop or asyncio.Event()
        c = self._consumer()
        try:
            await c.start()
        except Exception as e:
            with contextlib.suppress(Exception):
                await c.stop()
            raise await diagnose(e, self.cfg.bootstrap,
                                                f"reading {self.cfg.topic}") from e
        self.log("notify_started", topic=self.cfg.topic, group=self.cfg.group_id,
                 webhooks=",".join(r.where for r in self.cfg.receivers),
                 alertmanagers=",".join(a.where for a in self.cfg.alertmanagers),
                 group_by=",".join(self.cfg.policy.group_by))
        self._client = HttpSecurity().client(self.cfg.retry.timeout_s)
        status = None
        if self.alertmanagers is not None:
            self.alertmanagers.start()
            if self.cfg.status_topic:
                status = asyncio.create_task(self._follow_status(stop))
        committed: dict[Any, int] = {}
        follower = asyncio.create_task(follow_holds(self.cfg.bootstrap, self.cfg.holds_topic,
                                                    self.holds, stop)) \
            if self.holds is not None and self.cfg.holds_topic else None
        waited = time.monotonic()  # the mutes in force first (bounded: they may be absent)
        while follower is not None and self.holds is not None and not self.holds.caught_up \
                and time.monotonic() - waited < HOLDS_WAIT_S and not stop.is_set():
            await asyncio.sleep(0.1)
        calm = broker_calm.install()  # aiokafka's per-retry errors: one line per state change
        polled = 0.0
        commit_failures = 0  # in a row: the first is logged, then every 100th
        try:
            while not stop.is_set():
                if time.monotonic() - polled >= broker_calm.POLL_S:
                    polled = time.monotonic()
                    calm.poll(time.time())
                dues = [t for t in (self.grouper.next_due(), self.limiter.next_digest_at(),
                                    self.book.next_due() if self.book else None)
                        if t is not None]
                due = min(dues) if dues else None
                wait_ms = 500 if due is None else int(max(0.0, min(0.5, due - self.clock()))
                                                     * 1000)
                batch = await c.getmany(timeout_ms=max(wait_ms, 1))
                for tp, msgs in batch.items():
                    for m in msgs:
                        self.take(m.value, tp, m.offset)
                self.flush()
                positions = {tp: await c.position(tp) for tp in c.assignment()}
                offsets = {tp: o for tp, o in self.committable(positions).items()
                           if committed.get(tp) != o}
                if offsets:
                    try:
                        await c.commit(offsets)
                        committed.update(offsets)
                        commit_failures = 0
                    except Exception as e:  # noqa: BLE001 - a rebalance: commit next round
                        if commit_failures % 100 == 0:  # the broker away: not every round
                            self.log("notify_commit_failed", error=repr(e)[:300],
                                     failures_in_a_row=commit_failures + 1)
                        commit_failures += 1
            queues = [asyncio.create_task(q.join()) for q in self._queues.values()]
            if queues:  # posts queued or in flight finish first (digests not yet due wait)
                await asyncio.wait(queues, timeout=self.cfg.retry.max_s)
            for t in [*queues, *self._tasks]:
                t.cancel()
            if self.alertmanagers is not None:
                await self.alertmanagers.stop(self.cfg.retry.max_s)
        finally:
            if follower is not None:
                follower.cancel()
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await follower
            if status is not None:
                status.cancel()
            with contextlib.suppress(Exception):
                await asyncio.wait_for(c.stop(), 10)
            with contextlib.suppress(Exception):
                await self._client.aclose()

    async def _follow_status(self, stop: asyncio.Event) -> None:
        """Read the status topic from its end while running (no consumer group: every
        notifier reads it all); a broker or topic away is retried every 5 s."""
        topic = str(self.cfg.status_topic)
        while not stop.is_set():
            c = clients.consumer(topic, bootstrap_servers=self.cfg.bootstrap, group_id=None,
                                 enable_auto_commit=False, auto_offset_reset="latest",
                                 client_id="faultwatch-notify-status",
                                 **broker_calm.client_backoff())
            try:
                await c.start()
                self.log("alert_status_following", topic=topic)
                while not stop.is_set():
                    batch = await c.getmany(timeout_ms=500)
                    for msgs in batch.values():
                        for m in msgs:
                            self.observe_status(m.value)
            except asyncio.CancelledError:
                raise
            except Exception as e:  # noqa: BLE001 - alerts then lapse by max_open_s
                self.log("alert_status_unavailable", topic=topic, error=repr(e)[:300],
                         retry_in_s=5)
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(stop.wait(), 5)
            finally:
                with contextlib.suppress(Exception):
                    await asyncio.wait_for(c.stop(), 10)
