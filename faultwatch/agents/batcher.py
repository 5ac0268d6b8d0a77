"""Batching a child's Lines into `lines` records: N lines, B bytes or a linger time."""

from __future__ import annotations

import asyncio
import re
from collections.abc import Callable

from faultwatch.agents.spool import KEEP
from faultwatch.core.events import Line

# A record must stay under the broker's default message.max.bytes (1 MiB) after encoding.
MAX_RECORD_BYTES = 900 * 1024
_ERROR_HINT = re.compile(
    r"Traceback|Error|ERROR|error:|Exception|FATAL|Fatal|fatal|Killed|Segmentation fault"
    r"|NCCL WARN|CUDA|Xid|core dumped|Aborted|panic")


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
