"""faultwatch's own event lines: one named event per line, key=value fields, and the escaping
that keeps text from jobs (names, log lines) from forging a line or moving the cursor."""

from __future__ import annotations

import sys
import time
import unicodedata
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
