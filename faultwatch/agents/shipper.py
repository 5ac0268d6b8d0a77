"""Delivery to Kafka on its own thread and event loop: spool first, release on broker ack."""

from __future__ import annotations

import asyncio
import collections
import contextlib
import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from aiokafka.codec import has_zstd  # type: ignore[import-untyped,unused-ignore]

from faultwatch.agents.spool import KEEP, LIFECYCLE, Record, Spool, SpoolError
from faultwatch.errors import BrokerAuthError
from faultwatch.kafka import clients
from faultwatch.kafka.errors import diagnose

Log = Callable[..., None]
_READ_MAX_BYTES = 1 << 20  # a spool read (under the lock) stays short: the reader waits on it
_SYNC_INTERVAL_S = 1.0
# aiokafka keeps one produce request in flight per broker, so a batch is what one round
# trip carries: as large as the broker takes (message.max.bytes, 1 MiB by default, bounds a
# compressed batch; an uncompressed bound keeps even incompressible output under it).
BATCH_BYTES = 1000 * 1024
# Records are already batched (LineBatcher lingers); the producer sends at once, and what
# arrives while a request is in flight forms the next batch. A producer linger would add
# its wait to every window the delivery awaits.
LINGER_MS = 0
WRITE_DROP_REPORT_S = 5.0  # a full disk: one gap notice (and log event) per this period


def compression_choice() -> str:
    """zstd when aiokafka can use it (needs the cramjam package), else gzip."""
    return "zstd" if has_zstd() else "gzip"


@dataclass
class ShipperStats:
    lines_submitted: int = 0
    lines_acked: int = 0
    records_acked: int = 0
    drops: int = 0  # lines lost: spool write failures and the cap
    unspooled: int = 0  # priority records sent from memory because the spool write failed
    send_failures: int = 0
    producer_restarts: int = 0


class Shipper:
    """Spools every record first; a delivery thread sends them and releases them on ack.

    submit() runs on the caller's (reading) thread and only appends to the spool and to an
    in-memory queue of the same records; the delivery thread runs its own event loop with the
    Kafka producer (compression, network, retries), so reading never competes with sending
    on one event loop. One lock guards the spool; it is held for appends, acks and short
    (<= 1 MiB) spool reads, which happen only while the delivery catches up."""

    def __init__(self, bootstrap: str, topic: str, key: bytes, spool: Spool, log: Log,
                 compression: str | None = None, window: int = 256,
                 producer_factory: Callable[..., Any] | None = None,
                 mem_max_bytes: int = 32 << 20, unspooled_max_bytes: int = 4 << 20,
                 signer: Any = None):
        self.bootstrap, self.topic, self.key, self.spool = bootstrap, topic, key, spool
        # trust.nodesig.NodeSigner: each record is signed with the node key as it is sent
        # (on this delivery thread, never on the reading path)
        self.signer = signer
        self.compression = compression or compression_choice()
        self.window = window
        self.stats = ShipperStats()
        self.broker_up = False
        self._refused_logged = False
        self._log = log
        self._factory = producer_factory or clients.producer
        self._producer: Any = None
        self._lock = threading.Lock()
        self._mem: collections.deque[Record] = collections.deque()
        self._mem_bytes = 0
        self._mem_max = mem_max_bytes
        self._mem_ok = spool.first_pending_id == spool.next_id  # replay reads the spool first
        self._idle = False  # the delivery waits for new records: submit() must wake it
        self._oldest_unacked_ts: float | None = None
        self._notice: Callable[[int, int, int, str], None] | None = None
        self._thread: threading.Thread | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._wake: asyncio.Event | None = None
        self._stop: asyncio.Event | None = None
        self._delivery_dead = False
        self._cap_scheduled = False
        self._unreported_drops = (0, 0, 0)
        self._last_drop_report = -1e18
        self._drop_timer = False
        # A failed spool write (a full disk): priority records go from memory, ordinary
        # lines are dropped and counted, reported as one gap notice every few seconds.
        self._unspooled: collections.deque[Record] = collections.deque()
        self._unspooled_bytes = 0
        self._unspooled_max = unspooled_max_bytes
        self._unspooled_next_id = -1  # negative ids: never in the spool, never acked there
        self._spool_failing = False
        self._write_drops = (0, 0)  # (records, lines) not yet reported
        self._write_drop_lock = threading.Lock()
        self._write_drop_timer = False
        self._last_write_report = -1e18

    # ---- caller side (never blocks on Kafka) -------------------------------------------
    def submit(self, value: bytes, flags: int = 0, nlines: int = 0,
               key: bytes | None = None) -> Record | None:
        """Spool one record for delivery; returns None (and counts a drop) if it cannot."""
        self.stats.lines_submitted += nlines
        with self._lock:
            err, sent_from_memory = "", False
            try:
                rec: Record | None = self.spool.append(key or self.key, value, flags, nlines)
            except SpoolError as e:
                rec, err = self._unspooled_record(key or self.key, value, flags, nlines), str(e)
                sent_from_memory = rec is not None
                rec = None
            failing_changed = (err != "") != self._spool_failing
            self._spool_failing = err != ""
            drops = self.spool.take_drops()
            if rec is not None:
                if drops[0]:  # the cap dropped records that may sit in the memory queue
                    self._mem.clear()
                    self._mem_bytes = 0
                    self._mem_ok = False
                elif self._mem_ok and self._mem_bytes + len(value) <= self._mem_max:
                    self._mem.append(rec)
                    self._mem_bytes += len(value)
                else:
                    self._mem_ok = False
            wake, self._idle = self._idle, False
            cap = self.spool.defer_cap and not self._cap_scheduled and self.spool.over_cap
            if cap:
                self._cap_scheduled = True
        if self._loop is not None and (wake or cap):
            with contextlib.suppress(RuntimeError):  # the delivery loop is already closed
                if wake and self._wake is not None:
                    self._loop.call_soon_threadsafe(self._wake.set)
                if cap:
                    self._loop.call_soon_threadsafe(self._enforce_cap)
        if failing_changed:
            if err:
                self._log("spool_write_failed", error=err[:300],
                          note="priority records go from memory; lines are dropped, counted")
            else:
                self._log("spool_writable")
        if err and not sent_from_memory:
            self.stats.drops += nlines
            self._count_write_drop(nlines)
        if drops[0]:
            self._report_drops(drops, force=True)
        return rec

    def _unspooled_record(self, key: bytes, value: bytes, flags: int, nlines: int
                          ) -> Record | None:
        """Under the lock: queue a heartbeat, lifecycle or error record in memory when the
        spool cannot take it (bounded); None for an ordinary record or when over the bound."""
        if not flags & (LIFECYCLE | KEEP) \
                or self._unspooled_bytes + len(value) > self._unspooled_max:
            return None
        rec = Record(self._unspooled_next_id, key, value, flags, nlines, time.time())
        self._unspooled_next_id -= 1
        self._unspooled.append(rec)
        self._unspooled_bytes += len(value)
        self.stats.unspooled += 1
        return rec

    def _count_write_drop(self, nlines: int) -> None:
        """Count an ordinary record lost to a failed spool write; report at most every
        WRITE_DROP_REPORT_S (the first at once) as one spool_write_drops event and gap."""
        with self._write_drop_lock:
            r, n = self._write_drops
            self._write_drops = (r + 1, n + nlines)
            due = time.monotonic() - self._last_write_report >= WRITE_DROP_REPORT_S
            schedule = not due and not self._write_drop_timer and self._loop is not None
            if schedule:
                self._write_drop_timer = True
        if due:
            self.flush_write_drops()
        elif schedule and self._loop is not None:
            loop = self._loop
            with contextlib.suppress(RuntimeError):
                loop.call_soon_threadsafe(
                    loop.call_later, WRITE_DROP_REPORT_S, self.flush_write_drops)

    def flush_write_drops(self) -> None:
        """Report the ordinary records dropped by failed spool writes since the last report."""
        with self._write_drop_lock:
            (records, lines), self._write_drops = self._write_drops, (0, 0)
            self._write_drop_timer = False
            if records:
                self._last_write_report = time.monotonic()
        if not records:
            return
        self._log("spool_write_drops", dropped_records=records, dropped_lines=lines)
        if self._notice is not None:
            self._notice(records, lines, 0, "spool_write_failed")

    def _enforce_cap(self) -> None:
        """On the delivery thread: compact the spool under its cap (file I/O off the lock)."""
        self.spool.enforce_cap(self._lock)
        with self._lock:
            self._cap_scheduled = False
            drops = self.spool.take_drops()
            if drops[0]:  # dropped records may sit in the memory queue
                self._mem.clear()
                self._mem_bytes = 0
                self._mem_ok = False
        if drops[0]:
            self._report_drops(drops)

    def _report_drops(self, drops: tuple[int, int, int], force: bool = False) -> None:
        """Count drops; log them and send a gap note at most once a second (summed)."""
        self.stats.drops += drops[1]
        r, n, k = self._unreported_drops
        self._unreported_drops = (r + drops[0], n + drops[1], k + drops[2])
        now = time.monotonic()
        if not force and now - self._last_drop_report < 1.0:
            if self._loop is not None and not self._drop_timer:
                self._drop_timer = True
                self._loop.call_later(1.0, self._flush_drop_report)
            return
        self._flush_drop_report()

    def _flush_drop_report(self) -> None:
        self._drop_timer = False
        drops, self._unreported_drops = self._unreported_drops, (0, 0, 0)
        if not drops[0]:
            return
        self._last_drop_report = time.monotonic()
        self._log("spool_cap", dropped_records=drops[0], dropped_lines=drops[1],
                  spool_bytes=self.spool_bytes())
        if self._notice is not None:
            self._notice(*drops, "spool_cap")

    def submit_lifecycle(self, value: bytes, key: bytes | None = None) -> Record | None:
        return self.submit(value, LIFECYCLE, 0, key)

    def on_gap(self, notice: Callable[[int, int, int, str], None]) -> None:
        """notice(records, lines, kept, reason) is called when records were dropped (reason
        "spool_cap": the cap; "spool_write_failed": the spool could not be written)."""
        self._notice = notice

    def spool_depth(self) -> int:
        with self._lock:
            return self.spool.pending

    def spool_bytes(self) -> int:
        with self._lock:
            return self.spool.size_bytes

    @property
    def ack_lag_s(self) -> float:
        ts = self._oldest_unacked_ts
        if ts is None or self.spool_depth() == 0:
            return 0.0
        return max(0.0, time.time() - ts)

    # ---- lifecycle -----------------------------------------------------------------------
    def start(self) -> None:
        """Start the delivery thread (and its event loop); returns once it runs."""
        ready = threading.Event()
        self._thread = threading.Thread(target=self._thread_main, args=(ready,),
                                        name="faultwatch-delivery", daemon=True)
        self._thread.start()
        ready.wait(10)
        with self._lock:
            self.spool.defer_cap = True  # the delivery thread compacts, not the reader
            self.spool.defer_sync = True  # ... and fsyncs full segments

    async def drain(self, timeout: float) -> bool:
        """Wait until everything spooled is acked; False on timeout (the rest stays spooled)."""
        self.flush_write_drops()
        deadline = time.monotonic() + timeout
        while (self.spool_depth() or self._unspooled) and time.monotonic() < deadline \
                and not self._delivery_dead:
            await asyncio.sleep(0.02)
        return self.spool_depth() == 0 and not self._unspooled

    async def close(self) -> None:
        """Stop the delivery thread, fsync and close the spool."""
        if self._thread is not None:
            if self._loop is not None and self._stop is not None:
                with contextlib.suppress(RuntimeError):
                    self._loop.call_soon_threadsafe(self._stop.set)
            await asyncio.to_thread(self._thread.join, 15)
        with self._lock:
            self.spool.close()

    # ---- delivery thread -----------------------------------------------------------------
    def _thread_main(self, ready: threading.Event) -> None:
        loop = asyncio.new_event_loop()
        asyncio.set_event_loop(loop)
        self._wake, self._stop = asyncio.Event(), asyncio.Event()
        self._loop = loop
        ready.set()
        try:
            loop.run_until_complete(self._main())
        except Exception as e:  # noqa: BLE001 - never take the agent down; records stay spooled
            self._log("delivery_crashed", error=repr(e))
        finally:
            self._delivery_dead = True
            with contextlib.suppress(Exception):
                loop.run_until_complete(loop.shutdown_asyncgens())
            loop.close()

    async def _main(self) -> None:
        assert self._stop is not None
        tasks = [asyncio.create_task(self._run()), asyncio.create_task(self._sync_forever())]
        stop = asyncio.create_task(self._stop.wait())
        await asyncio.wait([stop, *tasks], return_when=asyncio.FIRST_COMPLETED)
        for t in tasks:
            t.cancel()
        for t in tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await t
        stop.cancel()
        await self._stop_producer()
        self._flush_drop_report()
        for t in tasks:
            if t.done() and not t.cancelled() and t.exception() is not None:
                raise t.exception()  # type: ignore[misc]

    async def _sync_forever(self) -> None:
        while True:
            await asyncio.sleep(_SYNC_INTERVAL_S)
            with self._lock:
                fds = self.spool.take_sync_fds()
            try:
                while fds:
                    with contextlib.suppress(OSError):
                        await asyncio.to_thread(os.fsync, fds[0])
                        self.spool.stats.fsyncs += 1
                    os.close(fds.pop(0))
            finally:  # cancelled at the stop: sync the rest here
                for fd in fds:
                    with contextlib.suppress(OSError):
                        os.fsync(fd)
                    os.close(fd)

    def _next_batch(self, cursor: int) -> tuple[list[Record], int]:
        """The next records from cursor (memory queue, else the spool); (batch, cursor)."""
        with self._lock:
            if self._unspooled:  # records the spool could not take go first
                n = min(self.window, len(self._unspooled))
                out = [self._unspooled.popleft() for _ in range(n)]
                self._unspooled_bytes -= sum(len(r.value) for r in out)
                return out, cursor
            mem = self._mem
            while mem and mem[0].id < cursor:
                self._mem_bytes -= len(mem.popleft().value)
            batch: list[Record] = []
            if not (mem and mem[0].id == cursor):
                batch = self.spool.read(cursor, self.window, _READ_MAX_BYTES)
                if mem:
                    batch = [r for r in batch if r.id < mem[0].id]
                    if not batch:  # everything before the queue was dropped by the cap
                        cursor = mem[0].id
            if not batch and mem and mem[0].id == cursor:
                batch = [mem.popleft() for _ in range(min(self.window, len(mem)))]
                self._mem_bytes -= sum(len(r.value) for r in batch)
            if not batch:
                if not mem:  # caught up with everything spooled: back to the memory queue
                    cursor = max(cursor, self.spool.next_id)
                    self._mem_ok = True
                    self._idle = True
                return [], cursor
            self.spool.protect_below = batch[-1].id + 1  # in flight: the cap must not drop it
        return batch, cursor

    async def _run(self) -> None:
        assert self._wake is not None
        with self._lock:
            cursor = self.spool.first_pending_id
        batch: list[Record] = []
        acked: set[int] = set()
        backoff, failures = 0.2, 0
        while True:
            if not batch:
                self._wake.clear()
                batch, cursor = self._next_batch(cursor)
                if not batch:
                    self._oldest_unacked_ts = None
                    await self._wake.wait()
                    continue
                acked = set()
                self._oldest_unacked_ts = batch[0].ts
            if self._producer is None and not await self._start_producer():
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, 5.0)
                continue
            if await self._send_window([r for r in batch if r.id not in acked], acked):
                if batch[-1].id >= 0:  # not records sent from memory past a failed spool
                    cursor = batch[-1].id + 1
                batch = []
                self._set_broker(True)
                backoff, failures = 0.2, 0
                continue
            failures += 1
            self.stats.send_failures += 1
            self._set_broker(False)
            if failures >= 2:
                self.stats.producer_restarts += 1
                await self._stop_producer()
            await asyncio.sleep(backoff)
            backoff = min(backoff * 2, 5.0)

    async def _start_producer(self) -> bool:
        p = self._factory(
            bootstrap_servers=self.bootstrap, enable_idempotence=True, acks="all",
            compression_type=self.compression, linger_ms=LINGER_MS, max_batch_size=BATCH_BYTES,
            max_request_size=2 * 1024 * 1024, request_timeout_ms=15000,
            retry_backoff_ms=200, client_id="faultwatch-agent")
        try:
            await asyncio.wait_for(p.start(), timeout=20)
        except Exception as e:  # noqa: BLE001 - any failure means "broker not reachable yet"
            with contextlib.suppress(Exception):
                await asyncio.wait_for(p.stop(), timeout=5)
            if not self._refused_logged:  # a refused password: say so once, keep spooling
                why = await diagnose(e, self.bootstrap, f"shipping to {self.topic}",
                                     timeout_s=5.0)
                if isinstance(why, BrokerAuthError):
                    self._refused_logged = True
                    self._log("broker_refused", error=str(why), spool_depth=self.spool_depth())
            self._set_broker(False, error=repr(e))
            return False
        self._producer = p
        return True

    async def _stop_producer(self) -> None:
        p, self._producer = self._producer, None
        if p is not None:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(p.stop(), timeout=5)

    def _set_broker(self, up: bool, **kv: Any) -> None:
        if up != self.broker_up:
            self.broker_up = up
            self._log("broker_up" if up else "broker_down", spool_depth=self.spool_depth(), **kv)

    async def _send_window(self, batch: list[Record], acked: set[int]) -> bool:
        p = self._producer
        futs: list[tuple[Record, asyncio.Future[Any]]] = []
        ok = True
        try:
            for rec in batch:
                signed = {} if self.signer is None else \
                    {"headers": self.signer.headers(rec.value)}
                futs.append((rec, await p.send(self.topic, rec.value, key=rec.key, **signed)))
        except Exception as e:  # noqa: BLE001
            if self.broker_up:
                self._log("send_error", error=repr(e))
            ok = False
        if futs:
            done, _ = await asyncio.wait([f for _, f in futs], timeout=30)
            good = [rec for rec, f in futs
                    if f in done and not f.cancelled() and f.exception() is None
                    and rec.id not in acked]
            ok = ok and len(good) == len(futs)
            with self._lock:
                for rec in good:
                    acked.add(rec.id)
                    self.spool.ack(rec.id)
            self.stats.records_acked += len(good)
            self.stats.lines_acked += sum(r.nlines for r in good)
        return ok
