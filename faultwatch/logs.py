"""Structured logs for faultwatch's own events: one named event per line, key=value fields."""

from __future__ import annotations

import sys
import time
from typing import Any, TextIO

from faultwatch.render import clean

_COMPONENT = "faultwatch"


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
