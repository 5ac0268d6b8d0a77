"""The matcher stage's glue: one decoded logs-topic record in, the job signals it implies out."""

from __future__ import annotations

from typing import Any

from faultwatch.core.events import Notice, Signal
from faultwatch.core.matching import LineMatcher, signals_of_exit, signals_of_lines
from faultwatch.errors import DecodeError
from faultwatch.wire import exit_of, heartbeat_of, line_rows, note_signal, notice_of, run_start_of

# note kinds the job state uses as they are (progress and stage notes become signals)
NOTICE_KINDS = ("notify", "retryable_errors", "bootcheck", "gap", "spawn_failed")


def signals_of_record(record: dict[str, Any], matcher: LineMatcher) -> list[Signal]:
    """Signals for one logs-topic record (wire.decode'd); raises DecodeError if malformed."""
    t = record["t"]
    if t == "lines":
        try:
            job, attempt = str(record["job"]), int(record["attempt"])
            node = str(record["node"])
        except (KeyError, TypeError, ValueError) as e:
            raise DecodeError(f"malformed lines record: {e!r}") from None
        return signals_of_lines(job, attempt, node, line_rows(record), matcher,
                                rank=record.get("rank"))
    if t == "start":
        return [run_start_of(record)]
    if t == "hb":
        return [heartbeat_of(record)]
    if t == "exit":
        return signals_of_exit(exit_of(record), matcher)
    if t == "note":
        return note_signals(notice_of(record))
    raise DecodeError(f"unknown record type {t!r}")


def note_signals(n: Notice) -> list[Signal]:
    """SDK/agent notes: progress and stage notes become signals; known kinds pass through;
    a kind this processor does not know (a newer agent) is ignored."""
    sig = note_signal(n)
    if sig is not None:
        return [sig]
    return [n] if n.kind in NOTICE_KINDS else []
