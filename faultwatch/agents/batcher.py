"""Batching a child's Lines into `lines` records: N lines, B bytes or a linger time."""

from __future__ import annotations

import asyncio
import re
from collections.abc import Callable, Sequence
from typing import Any

from faultwatch.agents.config import FIRST_LINGER_MS, LINGER_MS
from faultwatch.agents.reader import LineBlock, Piece
from faultwatch.agents.spool import KEEP
from faultwatch.core.events import Line
from faultwatch.wire import MAX_RECORD_BYTES

_HINT_WORDS = ("Traceback", "Error", "ERROR", "error:", "Exception", "FATAL", "Fatal", "fatal",
               "Killed", "Segmentation fault", "NCCL WARN", "CUDA", "Xid", "core dumped",
               "Aborted", "panic")
_ERROR_HINT = re.compile("|".join(map(re.escape, _HINT_WORDS)))


class _Hint:
    """Whether a text holds an error word (its record is then KEEP: dropped last at the
    spool cap). One hyperscan pass (GB/s) where available, else the regex."""

    def __init__(self) -> None:
        self._db: Any = None
        try:
            import hyperscan  # type: ignore[import-untyped,unused-ignore]

            db = hyperscan.Database(mode=hyperscan.HS_MODE_BLOCK)
            words = [w.encode() for w in _HINT_WORDS]
            db.compile(expressions=words, ids=list(range(len(words))), elements=len(words),
                       flags=[hyperscan.HS_FLAG_SINGLEMATCH] * len(words))
            self._db, self._stop = db, hyperscan.ScanTerminated
        except Exception:  # noqa: BLE001 - absent or refusing: the regex does the same job
            self._db = None

    def __call__(self, texts: Sequence[str]) -> bool:
        if self._db is None:
            return any(_ERROR_HINT.search(t) for t in texts)
        data = (texts[0] if len(texts) == 1 else "\n".join(texts)).encode(
            "utf-8", "surrogatepass")
        try:
            self._db.scan(data, match_event_handler=_stop_scan)
        except self._stop:
            return True
        return False


def _stop_scan(*_: Any) -> bool:
    return True  # the first match is enough: stop the scan


has_error_hint = _Hint()


def _head_end(text: str, start: int, nlines: int, max_lines: int, max_chars: int
              ) -> tuple[int, int] | None:
    """Where a head of the nlines lines text[start:] ends (its "\\n") and its line count:
    at most max_lines lines and max_chars characters, cut where lines of even length would
    fill them; None when even the first line does not fit (or there is only one)."""
    if nlines < 2 or max_lines < 1:
        return None
    size = len(text) - start
    cut = start + min(size, max_chars, size * max_lines // nlines)
    while True:
        nl = text.rfind("\n", start, cut + 1)
        if nl < 0:
            return None
        k = text.count("\n", start, nl) + 1
        if k <= max_lines:
            return nl, k
        cut = start + (nl - start) * max_lines // k  # uneven lines: aim lower (nl shrinks)


def split_block(b: LineBlock, max_lines: int, max_chars: int
                ) -> tuple[LineBlock, LineBlock] | None:
    """A head of b with at most max_lines lines and max_chars characters (cut where lines
    of even length would fill them), and the rest; None when b has one line or even its
    first line does not fit."""
    cut = _head_end(b.text, 0, b.nlines, max_lines, max_chars)
    if cut is None:
        return None
    nl, k = cut
    return (LineBlock(b.stream, b.seq, b.ts, b.text[:nl], 0, 0, k),
            LineBlock(b.stream, b.seq + k, b.ts, b.text[nl + 1:], 0, 0, b.nlines - k))


BUSY_LINES = 16  # a record this full when its linger ran out: the child is flowing (>= 800
# lines/s at the first linger; 160 lines/s keep the longest one)


class LineBatcher:
    """Collects Lines and LineBlocks of both streams into `lines` records: N lines, B
    bytes (characters of text, plus 32 a piece) or linger. A block is cut at line ends
    to fill a record; each record's pieces are encoded together, in order.

    The linger adapts to the rate: after a quiet spell a record waits `first_linger_s`
    for more lines (a lone line ships promptly); each record whose linger ran out with
    at least BUSY_LINES lines doubles the next linger, up to `linger_s`, so a flowing or
    bursting child's lines go out in fewer, larger records; a record that ran out with
    fewer lines brings it back to `first_linger_s`."""

    def __init__(self, encode: Callable[[list[Piece]], bytes],
                 submit: Callable[[bytes, int, int], object], max_lines: int = 20_000,
                 max_bytes: int = 256 * 1024, linger_s: float = LINGER_MS / 1000,
                 first_linger_s: float = FIRST_LINGER_MS / 1000):
        self._encode = encode
        self._submit = submit
        self.max_lines, self.max_bytes, self.linger_s = max_lines, max_bytes, linger_s
        self.first_linger_s = min(first_linger_s, linger_s)
        self.current_linger_s = self.first_linger_s
        self._items: list[Piece] = []
        self._lines = 0
        self._bytes = 0
        self._timer: asyncio.TimerHandle | None = None

    def add(self, pieces: Sequence[Piece]) -> None:
        for p in pieces:
            if type(p) is LineBlock:
                self._add_block(p)
            else:
                self._put(p, 1)
        if self._items and self._timer is None:
            self._timer = asyncio.get_running_loop().call_later(self.current_linger_s,
                                                                self._linger_over)

    def _linger_over(self) -> None:
        """The record's linger ran out: adapt the next one to how full it got, ship it."""
        self._timer = None
        if self._lines >= BUSY_LINES:
            self.current_linger_s = min(self.linger_s, 2 * self.current_linger_s)
        else:
            self.current_linger_s = self.first_linger_s
        self.flush()

    def _add_block(self, b: LineBlock) -> None:
        """Add b, cut at line ends to fill records: each head is sliced from b's text once
        (a large read is not copied again for every record it fills)."""
        text, start, seq, left = b.text, 0, b.seq, b.nlines
        while True:
            room_lines = self.max_lines - self._lines
            room_chars = self.max_bytes - self._bytes - 32
            if left <= room_lines and len(text) - start <= room_chars:
                self._put(b if start == 0 else
                          LineBlock(b.stream, seq, b.ts, text[start:], 0, 0, left), left)
                return
            cut = _head_end(text, start, left, room_lines, room_chars)
            if cut is None:
                if self._items:  # no room left here: a fresh record
                    self.flush()
                    continue
                self._put(LineBlock(b.stream, seq, b.ts, text[start:], 0, 0, left), left)
                return  # one line over the byte budget: a record of its own
            nl, k = cut
            self._put(LineBlock(b.stream, seq, b.ts, text[start:nl], 0, 0, k), k)
            self.flush()
            start, seq, left = nl + 1, seq + k, left - k

    def _put(self, p: Piece, nlines: int) -> None:
        self._items.append(p)
        self._lines += nlines
        self._bytes += len(p.text) + 32
        if self._lines >= self.max_lines or self._bytes >= self.max_bytes:
            self.flush()

    def flush(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if self._items:
            items, n = self._items, self._lines
            self._items, self._lines, self._bytes = [], 0, 0
            self._emit(items, n)

    def _emit(self, items: list[Piece], nlines: int) -> None:
        value = self._encode(items)
        if len(value) > MAX_RECORD_BYTES:
            if len(items) > 1:
                half = len(items) // 2
                self._emit(items[:half], _count(items[:half]))
                self._emit(items[half:], _count(items[half:]))
                return
            p = items[0]
            if type(p) is LineBlock:
                parts = split_block(p, max(1, p.nlines // 2), len(p.text) // 2)
                if parts is not None:
                    self._emit([parts[0]], parts[0].nlines)
                    self._emit([parts[1]], parts[1].nlines)
                    return
            # one line that escapes to > 900 KiB (control chars): cut it more
            cut = p.text[: len(p.text) // 8]
            value = self._encode([Line(p.stream, p.seq, p.ts, cut, p.flags | 1,
                                       p.orig_len or len(p.text.encode()))])
        hint = has_error_hint([p.text for p in items])
        self._submit(value, KEEP if hint else 0, nlines)


def _count(items: list[Piece]) -> int:
    return sum(p.nlines if type(p) is LineBlock else 1 for p in items)
