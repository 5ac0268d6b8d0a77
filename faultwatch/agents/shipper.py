"""Shipping to Kafka: batching lines into records, spooling them, delivering with acks."""

from __future__ import annotations

import asyncio
import contextlib
import re
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from aiokafka import AIOKafkaProducer  # type: ignore[import-untyped,unused-ignore]
from aiokafka.codec import has_zstd  # type: ignore[import-untyped,unused-ignore]

from faultwatch.agents.spool import KEEP, LIFECYCLE, Record, Spool, SpoolError
from faultwatch.core.events import Line

# A record must stay under the broker's default message.max.bytes (1 MiB) after encoding.
MAX_RECORD_BYTES = 900 * 1024
_ERROR_HINT = re.compile(
    r"Traceback|Error|ERROR|error:|Exception|FATAL|Fatal|fatal|Killed|Segmentation fault"
    r"|NCCL WARN|CUDA|Xid|core dumped|Aborted|panic")

Log = Callable[..., None]


def compression_choice() -> str:
    """zstd when aiokafka can use it (needs the cramjam package), else gzip."""
    return "zstd" if has_zstd() else "gzip"


@dataclass
class ShipperStats:
    lines_submitted: int = 0
    lines_acked: int = 0
    records_acked: int = 0
    drops: int = 0  # lines lost: spool write failures and the cap
    send_failures: int = 0
    producer_restarts: int = 0


class LineBatcher:
    """Collects Lines of both streams into `lines` records: N lines, B bytes or linger."""

    def __init__(self, encode: Callable[[list[Line]], bytes],
                 submit: Callable[[bytes, int, int], object], max_lines: int = 500,
                 max_bytes: int = 64 * 1024, linger_s: float = 0.02):
        self._encode = encode
        self._submit = submit
        self.max_lines, self.max_bytes, self.linger_s = max_lines, max_bytes, linger_s
        self._lines: list[Line] = []
        self._bytes = 0
        self._timer: asyncio.TimerHandle | None = None

    def add(self, lines: list[Line]) -> None:
        for ln in lines:
            self._lines.append(ln)
            self._bytes += len(ln.text) + 32
            if len(self._lines) >= self.max_lines or self._bytes >= self.max_bytes:
                self.flush()
        if self._lines and self._timer is None:
            self._timer = asyncio.get_running_loop().call_later(self.linger_s, self.flush)

    def flush(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if self._lines:
            lines, self._lines, self._bytes = self._lines, [], 0
            self._emit(lines)

    def _emit(self, lines: list[Line]) -> None:
        value = self._encode(lines)
        if len(value) > MAX_RECORD_BYTES:
            if len(lines) > 1:
                half = len(lines) // 2
                self._emit(lines[:half])
                self._emit(lines[half:])
                return
            ln = lines[0]  # one line that escapes to > 900 KiB (control chars): cut it more
            cut = ln.text[: len(ln.text) // 8]
            value = self._encode([Line(ln.stream, ln.seq, ln.ts, cut, ln.flags | 1,
                                       ln.orig_len or len(ln.text.encode()))])
        hint = any(_ERROR_HINT.search(ln.text) for ln in lines)
        self._submit(value, KEEP if hint else 0, len(lines))


class Shipper:
    """Spools every record first, then a delivery task sends them and releases on ack."""

    def __init__(self, bootstrap: str, topic: str, key: bytes, spool: Spool, log: Log,
                 compression: str | None = None, window: int = 256,
                 producer_factory: Callable[..., Any] | None = None):
        self.bootstrap, self.topic, self.key, self.spool = bootstrap, topic, key, spool
        self.compression = compression or compression_choice()
        self.window = window
        self.stats = ShipperStats()
        self.broker_up = False
        self._log = log
        self._factory = producer_factory or AIOKafkaProducer
        self._producer: Any = None
        self._wake = asyncio.Event()
        self._closing = False
        self._oldest_unacked_ts: float | None = None
        self._task: asyncio.Task[None] | None = None
        self._notice: Callable[[int, int, int], None] | None = None

    # ---- producer side (never blocks) ----------------------------------------------------
    def submit(self, value: bytes, flags: int = 0, nlines: int = 0) -> Record | None:
        """Spool one record for delivery; returns None (and counts a drop) if it cannot."""
        self.stats.lines_submitted += nlines
        try:
            rec = self.spool.append(self.key, value, flags, nlines)
        except SpoolError as e:
            self.stats.drops += nlines
            self._log("spool_error", error=str(e))
            return None
        self._wake.set()
        recs, lines, kept = self.spool.take_drops()
        if recs:
            self.stats.drops += lines
            self._log("spool_cap", dropped_records=recs, dropped_lines=lines, spool_bytes=self
                      .spool.size_bytes)
            if self._notice is not None:
                self._notice(recs, lines, kept)
        return rec

    def submit_lifecycle(self, value: bytes) -> Record | None:
        return self.submit(value, LIFECYCLE, 0)

    def on_gap(self, notice: Callable[[int, int, int], None]) -> None:
        """notice(records, lines, kept) is called when the cap dropped records."""
        self._notice = notice

    @property
    def ack_lag_s(self) -> float:
        if self._oldest_unacked_ts is None or self.spool.pending == 0:
            return 0.0
        return max(0.0, time.time() - self._oldest_unacked_ts)

    # ---- delivery ------------------------------------------------------------------------
    def start(self) -> None:
        self._task = asyncio.create_task(self._run(), name="faultwatch-delivery")

    async def drain(self, timeout: float) -> bool:
        """Wait until everything spooled is acked; False on timeout (the rest stays spooled)."""
        deadline = time.monotonic() + timeout
        while self.spool.pending and time.monotonic() < deadline:
            if self._task is not None and self._task.done():
                break
            await asyncio.sleep(0.02)
        return self.spool.pending == 0

    async def close(self) -> None:
        self._closing = True
        self._wake.set()
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._task
        await self._stop_producer()
        self.spool.close()

    async def _start_producer(self) -> bool:
        p = self._factory(
            bootstrap_servers=self.bootstrap, enable_idempotence=True, acks="all",
            compression_type=self.compression, linger_ms=20, max_batch_size=256 * 1024,
            max_request_size=2 * 1024 * 1024, request_timeout_ms=15000,
            retry_backoff_ms=200, client_id="faultwatch-agent")
        try:
            await asyncio.wait_for(p.start(), timeout=20)
        except Exception as e:  # noqa: BLE001 - any failure means "broker not reachable yet"
            with contextlib.suppress(Exception):
                await asyncio.wait_for(p.stop(), timeout=5)
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
            self._log("broker_up" if up else "broker_down", spool_depth=self.spool.pending, **kv)

    async def _run(self) -> None:
        cursor = self.spool.first_pending_id
        acked: set[int] = set()
        backoff = 0.2
        failures = 0
        while True:
            if self._producer is None and not await self._start_producer():
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, 5.0)
                continue
            batch = self.spool.read(cursor, self.window)
            if not batch:
                self._oldest_unacked_ts = None
                self._wake.clear()
                await self._wake.wait()
                continue
            self.spool.protect_below = batch[-1].id + 1
            self._oldest_unacked_ts = batch[0].ts
            if await self._send_window([r for r in batch if r.id not in acked], acked):
                cursor = batch[-1].id + 1
                acked = {i for i in acked if i >= cursor}
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

    async def _send_window(self, batch: list[Record], acked: set[int]) -> bool:
        p = self._producer
        futs: list[tuple[Record, asyncio.Future[Any]]] = []
        ok = True
        try:
            for rec in batch:
                futs.append((rec, await p.send(self.topic, rec.value, key=rec.key)))
        except Exception as e:  # noqa: BLE001
            self._log_once("send_error", error=repr(e))
            ok = False
        if futs:
            done, _ = await asyncio.wait([f for _, f in futs], timeout=30)
            for rec, f in futs:
                if f in done and not f.cancelled() and f.exception() is None:
                    if rec.id not in acked:
                        acked.add(rec.id)
                        self.spool.ack(rec.id)
                        self.stats.records_acked += 1
                        self.stats.lines_acked += rec.nlines
                else:
                    ok = False
        return ok

    def _log_once(self, event: str, **kv: Any) -> None:
        if self.broker_up:
            self._log(event, **kv)
