"""Turning a child's raw output bytes into Lines: splitting, \\r progress, truncation, tee."""

from __future__ import annotations

import asyncio
import collections
import os
import re
import threading
import time
from collections.abc import Callable
from typing import Any, NamedTuple

from faultwatch.core.events import CR_PROGRESS, INVALID_UTF8, TRUNCATED, Line

_DELIM = re.compile(rb"\r\n|\r|\n")
_TEE_MAX_BUFFER = 8 << 20
_TAIL_QUIET_S = 0.05  # the drawn bar is emitted only after the stream paused this long
READ_CHUNK_BYTES = 1 << 20  # one read (and one timestamp, one split) per up to 1 MiB
GATHER_S = 0.005  # after a small read, let the pipe fill this long (see pump)


def _trim_partial_utf8(b: bytes) -> bytes:
    """Drop an incomplete UTF-8 sequence at the end of b (left there by truncation)."""
    n = len(b)
    i = n - 1
    while i >= 0 and n - i <= 3 and (b[i] & 0xC0) == 0x80:
        i -= 1
    if i < 0:
        return b
    lead = b[i]
    if lead >> 5 == 0b110:
        need = 2
    elif lead >> 4 == 0b1110:
        need = 3
    elif lead >> 3 == 0b11110:
        need = 4
    else:
        need = 1
    return b[:i] if need > 1 and n - i < need else b


class LineBlock(NamedTuple):
    """Consecutive plain lines of one stream from one read, their texts joined by "\\n".

    The first six fields are a Line's (flags and orig_len always 0), so a block is a chunk
    of wire.encode_line_chunks as it is: the hot path builds one object per read, not one
    per line. No line text holds "\\n" or "\\r"."""

    stream: str
    seq: int  # the first line's
    ts: float
    text: str
    flags: int = 0
    orig_len: int = 0
    nlines: int = 1  # lines in text

    def lines(self) -> list[Line]:
        return [Line(self.stream, self.seq + i, self.ts, t)
                for i, t in enumerate(self.text.split("\n"))]


Piece = Line | LineBlock


def expand(pieces: list[Piece]) -> list[Line]:
    """The Lines of Lines and LineBlocks, in order."""
    out: list[Line] = []
    for p in pieces:
        if type(p) is LineBlock:
            out += p.lines()
        else:
            out.append(p)  # type: ignore[arg-type]
    return out


class LineSplitter:
    """Pure per-stream splitter: bytes in, Lines out; no I/O and no clock of its own."""

    def __init__(self, stream: str, max_line_bytes: int = 65536,
                 progress_interval_s: float = 1.0):
        if max_line_bytes < 4:
            raise ValueError("max_line_bytes must be at least 4")
        self.stream = stream
        self.max_line_bytes = max_line_bytes
        self.progress_interval_s = progress_interval_s
        self.next_seq = 0
        self.last_activity_ts: float | None = None  # last line end or \r update seen
        self._buf = bytearray()  # first max_line_bytes of the current segment
        self._len = 0  # full byte length of the current segment
        self._in_cr = False  # the current line has had \r-terminated segments
        self._held_cr = False  # data ended with \r: it may be the first half of \r\n
        self._pending: tuple[bytes, int] | None = None  # rate-limited progress update
        self._tail_emitted = False  # the unterminated \r segment was already emitted by tick
        self._last_feed_ts = float("-inf")
        self._next_progress_ts = float("-inf")

    # ---- public --------------------------------------------------------------------
    @property
    def has_pending(self) -> bool:
        """A \\r update waits to be emitted (see tick / pending_due).

        That is a rate-limited \\r-terminated update, or the bar currently drawn: the text
        after the last \\r, which tqdm leaves unterminated until its next redraw."""
        return self._pending is not None or self._tail_waiting

    @property
    def pending_due(self) -> float | None:
        """When tick() may emit the held \\r update, or None if none is held."""
        if not self.has_pending:
            return None
        return max(self._next_progress_ts, self._last_feed_ts + _TAIL_QUIET_S)

    @property
    def _tail_waiting(self) -> bool:
        return self._in_cr and self._len > 0 and not self._tail_emitted

    def feed(self, data: bytes, ts: float) -> list[Line]:
        """Split data read at ts into Lines (see feed_blocks)."""
        return expand(self.feed_blocks(data, ts))

    def feed_blocks(self, data: bytes, ts: float) -> list[Piece]:
        """Split data read at ts: runs of plain lines come as one LineBlock each, the rest
        (\\r updates, truncated or invalid UTF-8 lines, the end of a partial line) as Lines."""
        out: list[Piece] = []
        if not data:
            return out
        self._last_feed_ts = ts
        mv = memoryview(data)
        pos = 0
        if self._held_cr:
            self._held_cr = False
            if data[0:1] == b"\n":
                self._end_line(ts, out)
                pos = 1
            else:
                self._end_cr(ts, out)
        if b"\r" not in data:
            self._feed_lf_only(data, mv, pos, ts, out)
            return out
        end = len(data)
        for m in _DELIM.finditer(data, pos):
            s = m.start()
            if s > pos:
                self._append(mv[pos:s])
            pos = m.end()
            d = m.group()
            if d == b"\r":
                if pos == end:
                    self._held_cr = True
                else:
                    self._end_cr(ts, out)
            else:
                self._end_line(ts, out)
        if pos < end:
            self._append(mv[pos:end])
        return out

    def tick(self, ts: float) -> list[Line]:
        """Emit the held \\r update if its rate-limit interval has passed."""
        out: list[Piece] = []
        due = self.pending_due
        if due is None or ts < due:
            return []
        if self._tail_waiting:
            if self._buf.strip():
                raw, n = bytes(self._buf), self._len
                self._emit(raw, n, CR_PROGRESS, ts, out)
                self.last_activity_ts = ts
            self._tail_emitted = True
        elif self._pending is not None:
            raw, n = self._pending
            self._emit(raw, n, CR_PROGRESS, ts, out)
        self._pending = None
        self._next_progress_ts = ts + self.progress_interval_s
        return expand(out)

    def flush(self, ts: float) -> list[Line]:
        """End of stream: emit the unterminated last line and any held \\r update."""
        out: list[Piece] = []
        if self._held_cr:
            self._held_cr = False
            self._end_cr(ts, out)
        if self._len or self._in_cr:
            self._end_line(ts, out)  # also emits a held \r update
        return expand(out)

    # ---- internals -------------------------------------------------------------------
    def _feed_lf_only(self, data: bytes, mv: memoryview, pos: int, ts: float,
                      out: list[Piece]) -> None:
        nl = data.find(b"\n", pos)
        if nl < 0:
            self._append(mv[pos:])
            return
        self._append(mv[pos:nl])
        self._end_line(ts, out)
        pos = nl + 1
        end = data.rfind(b"\n") + 1
        if end > pos:
            self._emit_region(data, mv, pos, end - 1, ts, out)
            self.last_activity_ts = ts
        if end < len(data):
            self._append(mv[end:])

    def _emit_region(self, data: bytes, mv: memoryview, start: int, stop: int, ts: float,
                     out: list[Piece]) -> None:
        """data[start:stop]: whole lines joined by \\n (no \\r). One LineBlock when every line
        is valid UTF-8 and within max_line_bytes, else line by line."""
        if not self._has_long_line(data, start, stop):
            try:
                text = str(mv[start:stop], "utf-8")
            except UnicodeDecodeError:
                pass
            else:
                n = data.count(b"\n", start, stop) + 1
                out.append(LineBlock(self.stream, self.next_seq, ts, text, 0, 0, n))
                self.next_seq += n
                return
        limit = self.max_line_bytes
        for raw in data[start:stop].split(b"\n"):
            if len(raw) > limit:
                self._emit(raw[:limit], len(raw), TRUNCATED, ts, out)
            else:
                self._emit(raw, 0, 0, ts, out)

    def _has_long_line(self, data: bytes, start: int, stop: int) -> bool:
        """Whether a line of data[start:stop] (whole lines) is longer than max_line_bytes.

        Any run of limit+1 bytes covers a whole aligned window of (limit+1)//2 bytes, so
        only windows without a newline need a closer look: a few finds per read."""
        limit = self.max_line_bytes
        if stop - start <= limit:
            return False
        h = (limit + 1) // 2
        for w in range(start, stop - h + 1, h):
            if data.find(b"\n", w, w + h) >= 0:
                continue
            line_start = data.rfind(b"\n", start, w) + 1 or start
            line_end = data.find(b"\n", w + h, stop)
            if (stop if line_end < 0 else line_end) - line_start > limit:
                return True
        return False

    def _append(self, chunk: memoryview) -> None:
        if self._tail_emitted and len(chunk):
            self._tail_emitted = False  # the bar grew after tick emitted it
        room = self.max_line_bytes - len(self._buf)
        if room > 0:
            self._buf += chunk[:room]
        self._len += len(chunk)

    def _take(self) -> tuple[bytes, int]:
        raw, n = bytes(self._buf), self._len
        self._buf.clear()
        self._len = 0
        return raw, n

    def _end_line(self, ts: float, out: list[Piece]) -> None:
        raw, n = self._take()
        self.last_activity_ts = ts
        if not self._in_cr:
            self._emit(raw, n, TRUNCATED if n > len(raw) else 0, ts, out)
            return
        self._in_cr = False
        if self._tail_emitted:
            self._tail_emitted = False
            self._pending = None
        elif raw.strip():
            self._pending = None
            self._emit(raw, n, CR_PROGRESS | (TRUNCATED if n > len(raw) else 0), ts, out)
        elif self._pending is not None:
            praw, pn = self._pending
            self._pending = None
            self._emit(praw, pn, CR_PROGRESS | (TRUNCATED if pn > len(praw) else 0), ts, out)
        self._next_progress_ts = float("-inf")

    def _end_cr(self, ts: float, out: list[Piece]) -> None:
        raw, n = self._take()
        self._in_cr = True
        if self._tail_emitted:  # tick already emitted this segment
            self._tail_emitted = False
            return
        if not raw.strip():  # an empty or whitespace-only segment clears the bar: not output
            return
        self.last_activity_ts = ts
        if ts >= self._next_progress_ts:
            self._pending = None
            self._next_progress_ts = ts + self.progress_interval_s
            self._emit(raw, n, CR_PROGRESS | (TRUNCATED if n > len(raw) else 0), ts, out)
        else:
            self._pending = (raw, n)

    def _emit(self, raw: bytes, n: int, flags: int, ts: float, out: list[Piece]) -> None:
        if n > len(raw):
            flags |= TRUNCATED
            raw = _trim_partial_utf8(raw)
        else:
            n = 0
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError:
            text = raw.decode("utf-8", "replace")
            flags |= INVALID_UTF8
        out.append(Line(self.stream, self.next_seq, ts, text, flags, n))
        self.next_seq += 1


# torchrun's tee prefix as the agent asks for it (agents/torchrun_env.py): `[rank12]:`
_RANK_PREFIX = re.compile(r"\[rank(\d{1,7})\]:")
# one in the middle of a line (not at its start, not stacked right after another prefix)
_MIDLINE = re.compile(r"(?<=[^\n])(?<!\]:)\[rank\d{1,7}\]:")


def has_midline(text: str) -> bool:
    """_MIDLINE.search(text) is not None, without the regex on the common text: `re` finds
    no literal to skip to behind the lookbehinds and tries every position (70 % of the
    agent's CPU on a burst of plain lines). Counting `[rank` where it starts a line or
    follows a prefix is a few C scans; only text with another `[rank` runs the regex."""
    n = text.count("[rank")
    if n == 0:
        return False
    if n == text.count("\n[rank") + text.startswith("[rank") + text.count("]:[rank"):
        return False  # every one starts a line or is stacked after a prefix
    return _MIDLINE.search(text) is not None


class RankLineSplitter(LineSplitter):
    """A LineSplitter for torchrun's tee'd output, each line `[rankN]:text`: it rebuilds
    every rank's own lines, so two ranks' partial lines never merge.

    torchrun's tee reads each worker's file line by line and prints `prefix + line`; a line
    the worker has not finished yet is printed without its newline, and the next line on the
    console, of another rank, follows it: `[rank0]:step 3 lo[rank1]:step 3 loss 0.25`, and
    later `[rank0]:ss 0.25`. Each segment before a mid-line prefix is a rank's unfinished
    line: it is held (per rank) and joined with that rank's next segment:
    `[rank0]:step 3 loss 0.25` and `[rank1]:step 3 loss 0.25`. Blocks without a mid-line
    prefix (nearly all) pass as they are, renumbered; held segments are emitted at flush."""

    def __init__(self, stream: str, max_line_bytes: int = 65536,
                 progress_interval_s: float = 1.0):
        super().__init__(stream, max_line_bytes, progress_interval_s)
        self._out_seq = 0
        self._held: dict[int | None, tuple[str, str]] = {}  # rank -> (prefix, text so far)

    def feed_blocks(self, data: bytes, ts: float) -> list[Piece]:
        return self._rejoin(super().feed_blocks(data, ts))

    def tick(self, ts: float) -> list[Line]:
        return expand(self._rejoin(list(super().tick(ts))))

    def flush(self, ts: float) -> list[Line]:
        out = self._rejoin(list(super().flush(ts)))
        for prefix, text in self._held.values():  # unfinished at the end: as they are
            out.append(self._line(prefix + text, 0, 0, ts))
        self._held.clear()
        return expand(out)

    def _line(self, text: str, flags: int, orig_len: int, ts: float) -> Line:
        line = Line(self.stream, self._out_seq, ts, text, flags, orig_len)
        self._out_seq += 1
        return line

    def _rejoin(self, pieces: list[Piece]) -> list[Piece]:
        out: list[Piece] = []
        for p in pieces:
            if type(p) is LineBlock:
                if not self._held and not has_midline(p.text):
                    out.append(p._replace(seq=self._out_seq))
                    self._out_seq += p.nlines
                    continue
                for text in p.text.split("\n"):
                    self._one(text, 0, 0, p.ts, out)
            else:
                line: Line = p  # type: ignore[assignment]
                if line.flags & CR_PROGRESS or (not self._held
                                                and not has_midline(line.text)):
                    out.append(line._replace(seq=self._out_seq))
                    self._out_seq += 1
                else:
                    self._one(line.text, line.flags, line.orig_len, line.ts, out)
        return out

    def _one(self, text: str, flags: int, orig_len: int, ts: float, out: list[Piece]) -> None:
        """One physical line: its unfinished segments held, its last segment emitted with
        what its rank held before."""
        segs = _segments(text)
        for prefix, rank, body in segs[:-1]:
            held = self._held.get(rank)
            self._held[rank] = (held[0] if held else prefix, (held[1] if held else "") + body)
        prefix, rank, body = segs[-1]
        held = self._held.pop(rank, None)
        if held is not None:
            prefix, body = held[0], held[1] + body
        out.append(self._line(prefix + body, flags, orig_len, ts))


def _segments(text: str) -> list[tuple[str, int | None, str]]:
    """(prefix, rank, text) of each rank's part of one physical line; stacked prefixes
    (`[rank1]:[rank1]: Traceback`: torch's own inside the tee's) stay with their text."""
    out: list[tuple[str, int | None, str]] = []
    m = _RANK_PREFIX.match(text)
    start, prefix, rank = (m.end(), m.group(), int(m.group(1))) if m else (0, "", None)
    for mid in _MIDLINE.finditer(text, start):
        out.append((prefix, rank, text[start:mid.start()]))
        start, prefix = mid.end(), mid.group()
        rank = int(prefix[5:-2])
    out.append((prefix, rank, text[start:]))
    return out


class TeeWriter:
    """Copies raw chunks to an fd from a thread, never blocking the caller.

    At most max_buffer bytes wait; beyond that chunks are dropped and counted. A dead fd
    (EPIPE, EBADF, ...) makes every later write a counted drop, never an exception."""

    def __init__(self, fd: int, max_buffer: int = _TEE_MAX_BUFFER):
        self.fd = fd
        self.max_buffer = max_buffer
        self.dropped_bytes = 0
        self.dead = False
        self._q: collections.deque[bytes] = collections.deque()
        self._queued = 0
        self._closed = False
        self._cv = threading.Condition()
        self._thread = threading.Thread(target=self._run, name=f"tee-fd{fd}", daemon=True)
        self._thread.start()

    def write(self, data: bytes) -> None:
        with self._cv:
            if self.dead or self._closed or self._queued + len(data) > self.max_buffer:
                self.dropped_bytes += len(data)
                return
            self._q.append(data)
            self._queued += len(data)
            self._cv.notify()

    def close(self) -> None:
        with self._cv:
            self._closed = True
            self._cv.notify()

    async def aclose(self, timeout: float = 5.0) -> None:
        """Close and wait (off the event loop) up to timeout for the backlog to drain."""
        self.close()
        await asyncio.to_thread(self._thread.join, timeout)

    def _run(self) -> None:
        while True:
            with self._cv:
                while not self._q and not self._closed:
                    self._cv.wait()
                if not self._q:
                    return
                data = self._q.popleft()
            try:
                mv = memoryview(data)
                while mv:
                    mv = mv[os.write(self.fd, mv):]
            except OSError:
                with self._cv:
                    self.dead = True
                    self.dropped_bytes += len(data) + sum(len(d) for d in self._q)
                    self._q.clear()
                    self._queued = 0
                continue
            with self._cv:
                self._queued -= len(data)


async def pump(reader: asyncio.StreamReader, splitter: LineSplitter, tee_fd: int | None,
               sink: Callable[[list[Line]], None] | Callable[[list[Piece]], None],
               clock: Callable[[], float] = time.time, chunk_size: int = READ_CHUNK_BYTES,
               tee: TeeWriter | None = None, blocks: bool = False,
               pipe: asyncio.ReadTransport | None = None) -> None:
    """Read reader to EOF in chunks: tee every raw chunk, split it, hand Lines to sink.

    sink must not block. With blocks=True, sink gets Lines and LineBlocks (one per run of
    plain lines of a read: no Python object per line). A held \\r update is emitted once its
    interval passes even when the stream then stays silent. Pass `tee` to keep the
    TeeWriter (and its counters). Pass the reader's `pipe` transport to gather output: after
    a small read, reading pauses for GATHER_S while the (large) pipe fills, so a child
    writing line by line costs one wakeup per GATHER_S, not one per write."""
    own_tee = tee is None and tee_fd is not None
    if own_tee:
        assert tee_fd is not None
        tee = TeeWriter(tee_fd)
    split = splitter.feed_blocks if blocks else splitter.feed
    put: Callable[[list[Any]], None] = sink
    try:
        while True:
            due = splitter.pending_due
            if due is None:
                data = await reader.read(chunk_size)
            else:
                try:
                    data = await asyncio.wait_for(reader.read(chunk_size),
                                                  timeout=max(0.0, due - clock()) + 0.001)
                except TimeoutError:
                    lines = splitter.tick(clock())
                    if lines:
                        put(lines)
                    continue
            if not data:
                break
            if tee is not None:
                tee.write(data)
            pieces = split(data, clock())
            if pieces:
                put(pieces)
            if pipe is not None and len(data) < chunk_size // 4 and not pipe.is_closing():
                pipe.pause_reading()
                try:
                    await asyncio.sleep(GATHER_S)
                finally:
                    if not pipe.is_closing():
                        pipe.resume_reading()
        lines = splitter.flush(clock())
        if lines:
            put(lines)
    finally:
        if own_tee and tee is not None:
            await tee.aclose()
