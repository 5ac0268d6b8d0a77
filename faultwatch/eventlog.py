"""faultwatch's own event lines: one named event per line, key=value fields, the escaping
that keeps text from jobs (names, log lines) from forging a line or moving the cursor, and
`Quiet`, which counts repeated events instead of writing a line for each."""

from __future__ import annotations

import sys
import time
import unicodedata
from collections import Counter
from collections.abc import Callable, Iterable
from typing import Any, TextIO

_COMPONENT = "faultwatch"


def clean(value: object, keep_tab: bool = False) -> str:
    """value as one line of terminal text: control, format and line-break characters are
    shown escaped (\\n, \\x1b, \\u2028), so a name or a line cannot forge another line or
    move the cursor."""
    s = str(value)
    if s.isprintable() or all(_printable(c, keep_tab) for c in s):
        return s
    return "".join(c if _printable(c, keep_tab) else _escape(c) for c in s)


def _printable(c: str, keep_tab: bool) -> bool:
    return (c == "\t" and keep_tab) or (
        c.isprintable() or unicodedata.category(c) not in ("Cc", "Cf", "Zl", "Zp", "Cs"))


def _escape(c: str) -> str:
    named = {"\n": "\\n", "\r": "\\r", "\t": "\\t"}
    if c in named:
        return named[c]
    o = ord(c)
    return f"\\x{o:02x}" if o < 0x100 else f"\\u{o:04x}" if o < 0x10000 else f"\\U{o:08x}"


def set_component(name: str) -> None:
    """Name the process in every event line (agent, process, run)."""
    global _COMPONENT
    _COMPONENT = name


def _fmt(v: Any) -> str:
    """A value as one token: quoted when it has spaces, quotes or `=`; control, format and
    line-break characters always escaped (a value can never start a forged event line)."""
    s = str(v)
    if not s:
        return '""'
    if s.isprintable() and not any(c in s for c in ' "=\\'):
        return s
    return '"' + clean(s.replace("\\", "\\\\").replace('"', '\\"')) + '"'


def format_event(event: str, fields: dict[str, Any], ts: float | None = None,
                 component: str | None = None) -> str:
    """`ts=... component=... event=... k=v ...` (values with spaces or quotes are quoted)."""
    t = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(ts if ts is not None else time.time()))
    parts = [f"ts={t}Z", f"component={component or _COMPONENT}", f"event={event}"]
    parts += [f"{k}={_fmt(v)}" for k, v in fields.items() if v is not None]
    return " ".join(parts)


def log_event(event: str, stream: TextIO | None = None, **fields: Any) -> None:
    """Write one event line to stderr (never raises: our logs must not hurt the job)."""
    try:
        print(format_event(event, fields), file=stream or sys.stderr, flush=True)
    except (OSError, ValueError):
        pass


class Quiet:
    """Repeated events, counted: the first of each kind in full, then one summary line per
    interval.

    A process that writes into a training job's stderr (the agent) must not write a line per
    refused record: 5,000 forged decisions were 5,000 `decision_refused` lines (1 MB). `Quiet`
    wraps a log callable; events named in `events` are logged in full the first time for each
    `(event, reason)`, then counted, and `<event>_summary count=N by=reason:count,...` is logged
    at most once per `interval_s` (on the next such event, or on `flush()`). Other events pass.
    """

    def __init__(self, log: Callable[..., None], events: Iterable[str],
                 interval_s: float = 60.0, clock: Callable[[], float] = time.monotonic):
        self._log, self.events, self.interval_s, self._clock = log, set(events), interval_s, \
            clock
        self._first: set[tuple[str, str]] = set()
        self._counts: dict[str, Counter[str]] = {}
        self._last_summary: dict[str, float] = {}
        self.total: Counter[str] = Counter()

    def __call__(self, event: str, **fields: Any) -> None:
        if event not in self.events:
            self._log(event, **fields)
            return
        reason = str(fields.get("reason", ""))
        self.total[event] += 1
        now = self._clock()
        if (event, reason) not in self._first:
            self._first.add((event, reason))
            self._last_summary.setdefault(event, now)
            self._log(event, **fields, repeats=f"counted, one {event}_summary line per "
                                                f"{self.interval_s:.0f} s")
            return
        self._counts.setdefault(event, Counter())[reason or "-"] += 1
        if now - self._last_summary.get(event, now) >= self.interval_s:
            self._summary(event, now)

    def _summary(self, event: str, now: float) -> None:
        c = self._counts.pop(event, None)
        self._last_summary[event] = now
        if c:
            self._log(f"{event}_summary", count=sum(c.values()), total=self.total[event],
                      by=",".join(f"{k}:{v}" for k, v in c.most_common(8)),
                      interval_s=self.interval_s)

    def flush(self) -> None:
        """Log what is counted and not yet summarised (at exit)."""
        now = self._clock()
        for event in list(self._counts):
            self._summary(event, now)
