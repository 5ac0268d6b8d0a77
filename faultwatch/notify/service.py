"""`faultwatch notify`: the thin Kafka shell around the grouping core and the sender."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from faultwatch import wire
from faultwatch.errors import DecodeError
from faultwatch.kafka import clients
from faultwatch.kafka.errors import diagnose
from faultwatch.notify.grouping import Grouper, GroupingPolicy, Notification
from faultwatch.notify.sender import Receiver, RetryPolicy, deliver
from faultwatch.wire.signing import DecisionGate

Log = Callable[..., None]


@dataclass
class NotifierConfig:
    bootstrap: str
    topic: str
    receivers: tuple[Receiver, ...]
    group_id: str = "faultwatch-notify"
    policy: GroupingPolicy = field(default_factory=GroupingPolicy)
    retry: RetryPolicy = field(default_factory=RetryPolicy)
    from_beginning: bool = False


class Notifier:
    """Consumes decisions with a consumer group, groups them, posts the due notifications.

    Offsets are committed only up to the first decision not yet delivered (or given up on),
    so a restarted notifier sends what a stopped one had not sent."""

    def __init__(self, cfg: NotifierConfig, gate: DecisionGate, log: Log,
                 clock: Callable[[], float] = time.time):
        self.cfg, self.gate, self.log, self.clock = cfg, gate, log, clock
        self.grouper = Grouper(cfg.policy)
        self._where: dict[str, tuple[Any, int]] = {}  # decision id -> (tp, offset)
        self._inflight: dict[str, int] = {}  # decision id -> deliveries still running
        self._tasks: set[asyncio.Task[None]] = set()
        self.sent = 0

    def _consumer(self) -> Any:
        return clients.consumer(
            self.cfg.topic, bootstrap_servers=self.cfg.bootstrap, group_id=self.cfg.group_id,
            enable_auto_commit=False,
            auto_offset_reset="earliest" if self.cfg.from_beginning else "latest",
            client_id="faultwatch-notify")

    def take(self, value: bytes | None, tp: Any, offset: int) -> None:
        """One decisions-topic record: decode, check the signature, group."""
        if not self.gate.admit_record(value, topic=tp.topic, partition=tp.partition,
                                      offset=offset):
            return
        try:
            raw = wire.decision_to_dict(wire.decode_decision(value))
        except DecodeError as e:
            self.log("undecodable_decision", topic=tp.topic, partition=tp.partition,
                     offset=offset, error=str(e))
            return
        if self.grouper.add(raw, self.clock()):
            self._where[str(raw.get("id", ""))] = (tp, offset)

    def flush(self) -> None:
        """Start deliveries for the notifications that are due."""
        for note in self.grouper.due(self.clock()):
            for did in note.new_ids:
                self._inflight[did] = self._inflight.get(did, 0) + len(self.cfg.receivers)
            for receiver in self.cfg.receivers:
                task = asyncio.create_task(self._deliver(receiver, note))
                self._tasks.add(task)
                task.add_done_callback(self._tasks.discard)

    async def _deliver(self, receiver: Receiver, note: Notification) -> None:
        try:
            if await deliver(receiver, note, self.cfg.retry, self.log):
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
        waiting = self.grouper.pending_ids() | set(self._inflight)
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
                 group_by=",".join(self.cfg.policy.group_by))
        committed: dict[Any, int] = {}
        try:
            while not stop.is_set():
                due = self.grouper.next_due()
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
                    except Exception as e:  # noqa: BLE001 - a rebalance: commit next round
                        self.log("notify_commit_failed", error=repr(e)[:300])
            if self._tasks:
                await asyncio.wait(set(self._tasks), timeout=self.cfg.retry.max_s)
        finally:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(c.stop(), 10)
