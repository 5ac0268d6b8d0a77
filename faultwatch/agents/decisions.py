"""Following the decisions topic for one job, and what a decision means for this node."""

from __future__ import annotations

import asyncio
import contextlib
import time
import uuid
from collections.abc import Callable
from typing import Any

from faultwatch import wire
from faultwatch.core.events import Decision
from faultwatch.errors import DecodeError

Log = Callable[..., None]

# What the agent does about a decision (None: not for this node / nothing to do).
RESTART, BLACKLISTED, FAIL, NOTIFY = "restart", "blacklisted", "fail", "notify"
_START_MARGIN_S = 5.0  # read decisions published this long before the agent started


def verdict(dec: Decision, node: str, attempt: int) -> str | None:
    """This node's action for dec, or None when dec is not for (this attempt of) this node.

    restart: in sync mode the decision names every node of the job, in async mode only the
    failed ones; an empty node list means the whole job. blacklist: the named node exits
    (BLACKLISTED), the nodes in evidence.restart_nodes restart. fail: every node stops."""
    if dec.attempt != attempt:
        return None
    nodes = set(dec.nodes)
    if dec.action == "restart":
        return RESTART if not nodes or node in nodes else None
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


class DecisionFollower:
    """A group-less consumer of <prefix>decisions keeping the records keyed by one job.

    It starts reading at the agent's start time (by timestamp, so a decision published
    while the consumer was still connecting is not missed); a topic that does not exist yet
    is waited for. Decisions are deduplicated by id and queued for get()."""

    def __init__(self, bootstrap: str, topic: str, job: str, log: Log,
                 consumer_factory: Callable[..., Any] | None = None):
        self.bootstrap, self.topic, self.job = bootstrap, topic, job
        self.key = wire.job_key(job)
        self.start_ts = time.time()
        self.ready = asyncio.Event()  # assigned and positioned
        self._log = log
        self._factory = consumer_factory
        self._seen: set[str] = set()
        self._queue: asyncio.Queue[Decision] = asyncio.Queue()
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        self._task = asyncio.create_task(self._run(), name="faultwatch-decisions")

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._task

    async def get(self, timeout: float | None = None) -> Decision | None:
        """The next new decision for the job, or None after timeout seconds."""
        try:
            return await asyncio.wait_for(self._queue.get(), timeout)
        except TimeoutError:
            return None

    def get_nowait(self) -> Decision | None:
        try:
            return self._queue.get_nowait()
        except asyncio.QueueEmpty:
            return None

    def offer(self, d: dict[str, Any] | Decision) -> None:
        """Queue a decoded decision record unless its id was seen (also used by tests)."""
        try:
            dec = d if isinstance(d, Decision) else wire.decision_of(d)
        except DecodeError as e:
            self._log("undecodable_decision", error=str(e))
            return
        if dec.job != self.job or dec.id in self._seen:
            return
        self._seen.add(dec.id)
        self._queue.put_nowait(dec)

    async def _run(self) -> None:
        backoff = 0.5
        while True:
            try:
                await self._consume()
            except asyncio.CancelledError:
                raise
            except Exception as e:  # noqa: BLE001 - broker down: retry, never crash the agent
                self._log("decisions_unavailable", error=repr(e)[:300])
            await asyncio.sleep(backoff)
            backoff = min(backoff * 2, 5.0)

    def _consumer(self) -> Any:
        from aiokafka import AIOKafkaConsumer  # type: ignore[import-untyped,unused-ignore]

        factory = self._factory or AIOKafkaConsumer
        return factory(bootstrap_servers=self.bootstrap, group_id=None,
                       enable_auto_commit=False, request_timeout_ms=15000,
                       client_id=f"faultwatch-agent-decisions-{uuid.uuid4().hex[:6]}")

    async def _consume(self) -> None:
        from aiokafka import TopicPartition  # type: ignore[import-untyped,unused-ignore]

        c = self._consumer()
        await asyncio.wait_for(c.start(), 20)
        try:
            parts: set[int] = set()
            while not parts:  # the processor creates the topic; do not auto-create it here
                await c._client.force_metadata_update()  # noqa: SLF001
                parts = c.partitions_for_topic(self.topic) or set()
                if not parts:
                    await asyncio.sleep(1.0)
            tps = [TopicPartition(self.topic, p) for p in sorted(parts)]
            c.assign(tps)
            since_ms = int((self.start_ts - _START_MARGIN_S) * 1000)
            offsets = await c.offsets_for_times({tp: since_ms for tp in tps})
            ends = await c.end_offsets(tps)
            for tp in tps:
                o = offsets.get(tp)
                c.seek(tp, o.offset if o is not None else ends[tp])
            self.ready.set()
            while True:
                batch = await c.getmany(timeout_ms=500)
                for msgs in batch.values():
                    for m in msgs:
                        if m.key != self.key:
                            continue
                        try:
                            self.offer(wire.decode_decision(m.value))
                        except DecodeError as e:
                            self._log("undecodable_decision", offset=m.offset, error=str(e))
        finally:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(c.stop(), 5)
