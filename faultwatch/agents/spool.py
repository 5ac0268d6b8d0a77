"""Disk spool: write-ahead, segmented, CRC-framed records kept until the broker acked them."""

from __future__ import annotations

import asyncio
import bisect
import contextlib
import fcntl
import os
import struct
import time
import zlib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from faultwatch.errors import FaultwatchError

MAGIC = b"FWS1"
# magic | payload_len u32 | crc32 u32 | id u64 | ts f64 | flags u8 | nlines u32 | key_len u16
_HEAD = struct.Struct("<4sIIQdBIH")
_CRC_FROM = 12  # the crc covers everything after magic, length and crc
KEEP = 1  # the record holds errors/tracebacks: dropped only after ordinary records
LIFECYCLE = 2  # start / heartbeat / exit / notice records
_SUFFIX = ".seg"
ACKED_FILE = "acked"  # the ack watermark: every id <= it was delivered (or dropped)
_ACKED = struct.Struct("<qI")  # watermark i64 | crc32 of it
_MAX_ACKED_AHEAD = 1 << 16
ACK_PERSIST_S = 0.1  # the watermark reaches the file at most this late (and at deletions)
_MAX_DEFERRED_SYNCS = 64  # closed segments waiting for the delivery thread's fsync


class SpoolError(FaultwatchError):
    """The spool directory cannot be created, written or read."""


@dataclass(frozen=True, slots=True)
class Record:
    """One spooled record: a Kafka key and value, with what the spool needs to manage it."""

    id: int
    key: bytes
    value: bytes
    flags: int = 0
    nlines: int = 0
    ts: float = 0.0

    @property
    def ordinary(self) -> bool:
        return not self.flags & (KEEP | LIFECYCLE)


@dataclass
class _Segment:
    path: Path
    first_id: int
    last_id: int = -1
    size: int = 0
    pending: int = 0  # records neither acked nor dropped
    ordinary: int = 0  # ordinary records still in the file


@dataclass
class SpoolStats:
    """Counters for heartbeats and logs."""

    corrupt: int = 0  # frames skipped on replay (bad CRC, torn writes)
    dropped_records: int = 0
    dropped_lines: int = 0
    replayed: int = 0
    skipped_acked: int = 0  # records of an earlier run found acked (not sent again)
    fsyncs: int = 0


def _frame_parts(rec: Record) -> tuple[bytes, bytes, bytes]:
    """A record's frame as (header, key, value): written with one writev, not joined."""
    body_head = _HEAD.pack(MAGIC, len(rec.value), 0, rec.id, rec.ts, rec.flags, rec.nlines,
                           len(rec.key))
    crc = zlib.crc32(body_head[_CRC_FROM:])
    crc = zlib.crc32(rec.key, crc)
    crc = zlib.crc32(rec.value, crc)
    return (body_head[:8] + struct.pack("<I", crc) + body_head[_CRC_FROM:], rec.key,
            rec.value)


def _frame(rec: Record) -> bytes:
    return b"".join(_frame_parts(rec))


def parse_frames(data: bytes) -> tuple[list[tuple[int, Record]], int]:
    """All intact records of a segment's bytes with their offsets, and the corrupt count."""
    out: list[tuple[int, Record]] = []
    corrupt = 0
    pos, n = 0, len(data)
    while pos < n:
        intact = data[pos:pos + 4] == MAGIC and pos + _HEAD.size <= n
        if intact:
            _, vlen, crc, rid, ts, flags, nlines, klen = _HEAD.unpack_from(data, pos)
            end = pos + _HEAD.size + klen + vlen
            intact = end <= n and zlib.crc32(data[pos + _CRC_FROM:end]) == crc
        if not intact:  # torn or corrupt: count it and resync at the next magic
            corrupt += 1
            nxt = data.find(MAGIC, pos + 1)
            if nxt < 0:
                break
            pos = nxt
            continue
        k0 = pos + _HEAD.size
        out.append((pos, Record(rid, data[k0:k0 + klen], data[k0 + klen:end], flags, nlines, ts)))
        pos = end
    return out, corrupt


class Spool:
    """Append-only segment files under one directory (one agent's job/node).

    append() assigns increasing ids; read() hands records to the delivery in id order;
    ack() releases them and a segment file is deleted once all its records are acked.
    Opening a spool that holds segments of an earlier run replays their records."""

    def __init__(self, directory: Path, cap_bytes: int = 256 << 20,
                 segment_bytes: int = 8 << 20, fsync_interval_s: float = 1.0):
        self.dir = Path(directory)
        self.cap_bytes = cap_bytes
        self.segment_bytes = min(segment_bytes, max(cap_bytes // 8, 4096))
        self.fsync_interval_s = fsync_interval_s
        self.stats = SpoolStats()
        self._segs: list[_Segment] = []
        self._firsts: list[int] = []
        self._fd: int | None = None
        self._next_id = 0
        self._dirty = False
        self._gen = 0  # bumped when a file is rewritten: read cursors must re-seek
        self._read_cache: tuple[int, Path, int, int] | None = None  # gen, path, next_id, offset
        self._unreported = (0, 0, 0)
        self.protect_below = 0  # the delivery's cursor: lower ids are in flight or acked
        self.defer_cap = False  # True: append() never compacts; enforce_cap() does, elsewhere
        # True: a full segment is not fsynced by append() (the reading thread) but handed
        # to take_sync_fds() for a delivery thread (within about a second).
        self.defer_sync = False
        self._closed_unsynced: list[int] = []
        self.acked_upto = -1  # every id <= it is acked or dropped (persisted in ACKED_FILE)
        self._acked_ahead: set[int] = set()  # acked ids above a gap in the watermark
        self._ack_fd = -1
        self._ack_persisted = -1
        self._ack_persist_at = 0.0
        try:
            # training logs can hold secrets: the spool is the agent user's alone
            for d in reversed([self.dir, *self.dir.parents]):  # missing ones, 0700 each
                if not d.exists():
                    d.mkdir(mode=0o700, exist_ok=True)
            with contextlib.suppress(OSError):  # made by an older agent: tighten it
                if self.dir.stat().st_mode & 0o077:
                    self.dir.chmod(0o700)
            self._lock_fd = os.open(self.dir / "lock", os.O_RDWR | os.O_CREAT, 0o600)
        except OSError as e:
            raise SpoolError(f"cannot create spool dir {self.dir}: {e}") from e
        try:
            fcntl.flock(self._lock_fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            os.close(self._lock_fd)
            raise SpoolError(f"spool dir {self.dir} is in use by another agent") from None
        self.acked_upto = self._ack_persisted = self._read_watermark()
        with contextlib.suppress(OSError):  # without it, a restart resends acked records
            self._ack_fd = os.open(self.dir / ACKED_FILE, os.O_RDWR | os.O_CREAT, 0o600)
        self._load()

    # ---- state -------------------------------------------------------------------------
    @property
    def next_id(self) -> int:
        return self._next_id

    @property
    def pending(self) -> int:
        """Records neither acked nor dropped (the spool depth)."""
        return sum(s.pending for s in self._segs)

    @property
    def size_bytes(self) -> int:
        return sum(s.size for s in self._segs)

    @property
    def first_pending_id(self) -> int:
        """The id from which a fresh reader must start (old runs' records included)."""
        for s in self._segs:
            if s.pending:
                return max(s.first_id, self.acked_upto + 1)
        return self._next_id

    # ---- writing -----------------------------------------------------------------------
    def append(self, key: bytes, value: bytes, flags: int = 0, nlines: int = 0,
               ts: float | None = None) -> Record:
        """Write one record (to the page cache; fsync happens in sync()). Never blocks long."""
        rec = Record(self._next_id, key, value, flags, nlines, time.time() if ts is None else ts)
        frame = _frame_parts(rec)
        size = len(frame[0]) + len(key) + len(value)
        seg = self._active_for(size)
        try:
            self._write(seg, frame)
        except OSError as e:
            if seg.pending or seg.size == 0:
                raise SpoolError(f"cannot write spool segment {seg.path}: {e}") from e
            # A full disk and an active segment holding only acked records: delete it and
            # retry once in a fresh segment (a healthy broker then recovers the space).
            self._close_active()
            seg = self._active_for(size)
            try:
                self._write(seg, frame)
            except OSError as e2:
                raise SpoolError(f"cannot write spool segment {seg.path}: {e2}") from e2
        self._next_id += 1
        seg.last_id = rec.id
        seg.size += size
        seg.pending += 1
        seg.ordinary += rec.ordinary
        self._dirty = True
        if not self.defer_cap and self.size_bytes > self.cap_bytes:
            self._enforce_cap(self.protect_below)
        return rec

    def _write(self, seg: _Segment, frame: tuple[bytes, bytes, bytes]) -> None:
        """Append one whole frame, or nothing: a short write (a full disk) is cut back."""
        assert self._fd is not None
        size = sum(map(len, frame))
        try:
            n = os.writev(self._fd, frame)
            if n != size:
                raise OSError(28, f"short write ({n} of {size} bytes): no space left")
        except OSError:
            with contextlib.suppress(OSError):
                os.ftruncate(self._fd, seg.size)
            raise

    @property
    def over_cap(self) -> bool:
        return self.size_bytes > self.cap_bytes

    def _active_for(self, nbytes: int) -> _Segment:
        if self._fd is not None:
            seg = self._segs[-1]
            if seg.size + nbytes <= self.segment_bytes or seg.size == 0:
                return seg
            self._close_active()
        path = self.dir / f"{self._next_id:016d}{_SUFFIX}"
        try:
            self._fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        except OSError as e:
            raise SpoolError(f"cannot create spool segment {path}: {e}") from e
        seg = _Segment(path, self._next_id)
        self._segs.append(seg)
        self._firsts.append(seg.first_id)
        return seg

    def _close_active(self) -> None:
        if self._fd is not None:
            fd, self._fd = self._fd, None
            if self.defer_sync and len(self._closed_unsynced) < _MAX_DEFERRED_SYNCS:
                self._closed_unsynced.append(fd)  # the delivery thread fsyncs and closes it
            else:
                with contextlib.suppress(OSError):
                    os.fsync(fd)
                os.close(fd)
            seg = self._segs[-1]
            if seg.pending == 0:
                self._delete(seg)

    def take_sync_fd(self) -> int | None:
        """A dup of the active segment's fd when it has unsynced writes (caller fsyncs, closes).

        Lets a delivery thread fsync outside the lock that guards append()."""
        if not self._dirty or self._fd is None:
            return None
        self._dirty = False
        return os.dup(self._fd)

    def take_sync_fds(self) -> list[int]:
        """Every fd with unsynced writes: full segments closed since the last call (with
        defer_sync) and a dup of the active one; the caller fsyncs and closes them."""
        fds, self._closed_unsynced = self._closed_unsynced, []
        fd = self.take_sync_fd()
        return fds if fd is None else [*fds, fd]

    def _sync_closed(self) -> None:
        for fd in self._closed_unsynced:
            with contextlib.suppress(OSError):
                os.fsync(fd)
            os.close(fd)
        self._closed_unsynced = []

    async def sync(self) -> None:
        """fsync the active segment off the event loop (called about once a second)."""
        fd = self.take_sync_fd()
        if fd is None:
            return
        try:
            await asyncio.to_thread(os.fsync, fd)
            self.stats.fsyncs += 1
        except OSError:
            pass
        finally:
            os.close(fd)

    async def sync_forever(self) -> None:
        while True:
            await asyncio.sleep(self.fsync_interval_s)
            await self.sync()

    def close(self) -> None:
        self._close_active()
        self._sync_closed()
        self._persist_watermark(force=True)
        if self._ack_fd >= 0:
            os.close(self._ack_fd)
            self._ack_fd = -1
        if self._lock_fd >= 0:
            os.close(self._lock_fd)  # releases the flock
            self._lock_fd = -1

    # ---- reading and releasing ---------------------------------------------------------
    def read(self, start_id: int, max_records: int = 256, max_bytes: int = 4 << 20
             ) -> list[Record]:
        """Records with id >= start_id in id order (skipping dropped ones)."""
        out: list[Record] = []
        size = 0
        i = max(0, bisect.bisect_right(self._firsts, start_id) - 1)
        nid = start_id
        while i < len(self._segs) and len(out) < max_records and size < max_bytes:
            seg = self._segs[i]
            i += 1
            if seg.last_id < nid or seg.pending == 0:
                continue
            offset = 0
            c = self._read_cache
            if c is not None and c[0] == self._gen and c[1] == seg.path and c[2] == nid:
                offset = c[3]
            try:
                with open(seg.path, "rb") as f:
                    f.seek(offset)
                    data = f.read()
            except OSError:
                continue
            frames, _ = parse_frames(data)
            for off, rec in frames:
                if rec.id < nid:
                    continue
                if len(out) >= max_records or size >= max_bytes:
                    self._read_cache = (self._gen, seg.path, rec.id, offset + off)
                    return out
                out.append(rec)
                size += len(rec.value)
                nid = rec.id + 1
            if frames:
                last_off, last = frames[-1]
                end = offset + last_off + _HEAD.size + len(last.key) + len(last.value)
                self._read_cache = (self._gen, seg.path, nid, end)
        return out

    def ack(self, rec_id: int) -> None:
        """The broker acked rec_id: release it; delete its segment once fully released."""
        if rec_id < 0:
            return
        self._done(rec_id)
        i = bisect.bisect_right(self._firsts, rec_id) - 1
        if i < 0:
            self._persist_watermark()
            return
        seg = self._segs[i]
        if rec_id > seg.last_id or seg.pending == 0:
            self._persist_watermark()
            return
        seg.pending -= 1
        if seg.pending == 0 and not (self._fd is not None and seg is self._segs[-1]):
            self._delete(seg)
            self._persist_watermark(force=True)
        else:
            self._persist_watermark()

    # ---- the ack watermark -------------------------------------------------------------
    def _done(self, rec_id: int) -> None:
        """rec_id is acked or dropped: move the watermark over every contiguous done id."""
        if rec_id <= self.acked_upto:
            return
        if rec_id != self.acked_upto + 1:
            if len(self._acked_ahead) >= _MAX_ACKED_AHEAD:  # bounded; segments still move it
                self._acked_ahead.clear()
            self._acked_ahead.add(rec_id)
            return
        self.acked_upto = rec_id
        while self._acked_ahead and self.acked_upto + 1 in self._acked_ahead:
            self.acked_upto += 1
            self._acked_ahead.discard(self.acked_upto)

    def _persist_watermark(self, force: bool = False) -> None:
        """Write the watermark in place (16 bytes, no new blocks: works on a full disk) at
        most every ACK_PERSIST_S; a SIGKILLed agent then resends only what was in flight."""
        if self._ack_fd < 0:
            return
        now = time.monotonic()
        if not force and now < self._ack_persist_at:
            return
        # Every id below the first segment still pending is done, whatever was tracked.
        floor = next((sg.first_id for sg in self._segs if sg.pending), self._next_id) - 1
        if floor > self.acked_upto:
            self.acked_upto = floor - 1
            self._acked_ahead = {i for i in self._acked_ahead if i > floor}
            self._done(floor)  # and on over the ids acked above it
        w = self.acked_upto
        if w == self._ack_persisted:
            return
        with contextlib.suppress(OSError):
            os.pwrite(self._ack_fd, _ACKED.pack(w, zlib.crc32(struct.pack("<q", w))), 0)
            self._ack_persisted = w
        self._ack_persist_at = now + ACK_PERSIST_S

    def _read_watermark(self) -> int:
        try:
            data = (self.dir / ACKED_FILE).read_bytes()
        except OSError:
            return -1
        if len(data) < _ACKED.size:
            return -1
        w, crc = _ACKED.unpack_from(data)
        return w if crc == zlib.crc32(struct.pack("<q", w)) and w >= -1 else -1

    def _delete(self, seg: _Segment) -> None:
        with contextlib.suppress(OSError):
            seg.path.unlink()
        i = self._segs.index(seg)
        del self._segs[i]
        del self._firsts[i]

    # ---- the cap -----------------------------------------------------------------------
    def take_drops(self) -> tuple[int, int, int]:
        """(records, lines, kept-kind records) dropped by the cap since the last call."""
        d, self._unreported = self._unreported, (0, 0, 0)
        return d

    def _enforce_cap(self, protect_from: int) -> list[Record]:
        """Drop the oldest ordinary records (then any) of closed segments to get under cap."""
        return self.enforce_cap(contextlib.nullcontext())

    def enforce_cap(self, lock: contextlib.AbstractContextManager[Any]) -> list[Record]:
        """Like the cap in append(), for a thread other than the appender's.

        Closed segments are immutable for append(), so each one is read, filtered and
        rewritten (to a temporary file) without `lock`; only the swap and the bookkeeping
        hold it, so the appending (reading) thread is never held up by the file I/O."""
        dropped: list[Record] = []
        # Segments closed while a pass ran are not in its list: before dropping a kept
        # (error/lifecycle) record, redo the ordinary pass over the fresh list (bounded).
        for ordinary_only in (True, True, True, False):
            with lock:
                segs = list(self._segs[:-1])
                if not ordinary_only and self._ordinary_droppable(segs):
                    segs = []  # the appender outran the passes: keep the kept records
            for seg in segs:
                with lock:
                    if self.size_bytes <= int(self.cap_bytes * 0.9):
                        return dropped
                    if seg not in self._segs or (ordinary_only and seg.ordinary == 0):
                        continue
                    protect_from = self.protect_below
                plan = self._compact_plan(seg, ordinary_only, protect_from)
                if plan is None:
                    continue
                with lock:
                    dropped += self._compact_commit(seg, *plan)
        return dropped

    def _ordinary_droppable(self, segs: list[_Segment]) -> bool:
        """Whether a closed segment still holds ordinary records above the in-flight ones."""
        return any(sg.ordinary and sg.last_id >= self.protect_below for sg in segs)

    def _compact_plan(self, seg: _Segment, ordinary_only: bool, protect_from: int
                      ) -> tuple[Path, int, list[Record], int] | None:
        """Write seg without the droppable records to a temporary file (no shared state)."""
        try:
            data = seg.path.read_bytes()
        except OSError:
            return None
        frames, _ = parse_frames(data)
        keep: list[bytes] = []
        dropped: list[Record] = []
        ordinary_kept = 0
        for _, rec in frames:
            if rec.id >= protect_from and (rec.ordinary or not ordinary_only):
                dropped.append(rec)
            else:
                keep.append(_frame(rec))
                ordinary_kept += rec.ordinary
        if not dropped:
            return None
        body = b"".join(keep)
        tmp = seg.path.with_suffix(".tmp")
        try:
            tmp.write_bytes(body)
        except OSError:
            return None
        return tmp, len(body), dropped, ordinary_kept

    def _compact_commit(self, seg: _Segment, tmp: Path, size: int, dropped: list[Record],
                        ordinary_kept: int) -> list[Record]:
        if seg not in self._segs:
            with contextlib.suppress(OSError):
                tmp.unlink()
            return []
        try:
            os.replace(tmp, seg.path)
        except OSError:
            return []
        self._gen += 1
        seg.size = size
        seg.pending = max(0, seg.pending - len(dropped))
        for rec in dropped:
            self._done(rec.id)
        seg.ordinary = ordinary_kept
        self.stats.dropped_records += len(dropped)
        self.stats.dropped_lines += sum(r.nlines for r in dropped)
        r0, l0, k0 = self._unreported
        self._unreported = (r0 + len(dropped), l0 + sum(r.nlines for r in dropped),
                            k0 + sum(1 for r in dropped if not r.ordinary))
        if seg.pending == 0:
            self._delete(seg)
        return dropped

    # ---- replay ------------------------------------------------------------------------
    def _load(self) -> None:
        for tmp in self.dir.glob("*.tmp"):
            with contextlib.suppress(OSError):
                tmp.unlink()
        for path in sorted(self.dir.glob(f"*{_SUFFIX}")):
            try:
                data = path.read_bytes()
            except OSError:
                continue
            frames, corrupt = parse_frames(data)
            self.stats.corrupt += corrupt
            if not frames:
                with contextlib.suppress(OSError):
                    path.unlink()
                continue
            ids = [r.id for _, r in frames]
            self._next_id = max(self._next_id, max(ids) + 1)
            live = [r for _, r in frames if r.id > self.acked_upto]  # acked before a crash
            self.stats.skipped_acked += len(frames) - len(live)
            if not live:
                with contextlib.suppress(OSError):
                    path.unlink()
                continue
            seg = _Segment(path, min(ids), max(ids), len(data), len(live),
                           sum(r.ordinary for r in live))
            self._segs.append(seg)
            self._firsts.append(seg.first_id)
            self.stats.replayed += len(live)
        # Ids never go back below the watermark, even when every segment was deleted.
        self._next_id = max(self._next_id, self.acked_upto + 1)

    def iter_all(self) -> Iterator[Record]:
        """Every pending record, in id order (for inspection and tests)."""
        nid = 0
        while True:
            batch = self.read(nid, 1024)
            if not batch:
                return
            yield from batch
            nid = batch[-1].id + 1
