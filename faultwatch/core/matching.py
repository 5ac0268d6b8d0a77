"""The matcher stage: one decoded logs-topic record in, the job signals it implies out."""

from __future__ import annotations

from typing import Any, Protocol

from faultwatch.core.events import (
    Hit,
    Line,
    Match,
    Output,
    Signal,
    TailLine,
)
from faultwatch.errors import DecodeError
from faultwatch.wire import exit_of, heartbeat_of, lines_of, run_start_of

TAIL_LINES = 8  # last lines of a batch forwarded as silence evidence


class BatchResult(Protocol):
    matches: tuple[Match, ...]
    rank_last_ts: dict[int | None, float]
    ranks: tuple[int | None, ...]


class LineMatcher(Protocol):
    def match_lines(self, lines: list[Line], *, default_rank: int | None = None) -> Any: ...

    def match_exit(self, exit_code: int, signal: int | None, ts: float) -> Match | None: ...


def signals_of(record: dict[str, Any], matcher: LineMatcher) -> list[Signal]:
    """Signals for one logs-topic record (already decoded); raises DecodeError if malformed."""
    t = record["t"]
    if t == "lines":
        return _lines(record, matcher)
    if t == "start":
        return [run_start_of(record)]
    if t == "hb":
        return [heartbeat_of(record)]
    if t == "exit":
        ev = exit_of(record)
        m = matcher.match_exit(ev.exit_code, ev.signal, ev.ts)
        hit: list[Signal] = [] if m is None else [Hit(ev.job, ev.attempt, ev.node, m)]
        return hit + [ev]
    if t == "note":
        return []
    raise DecodeError(f"unknown record type {t!r}")


def _lines(record: dict[str, Any], matcher: LineMatcher) -> list[Signal]:
    lines = lines_of(record)
    try:
        job, attempt, node = str(record["job"]), int(record["attempt"]), str(record["node"])
    except (KeyError, TypeError, ValueError) as e:
        raise DecodeError(f"malformed lines record: {e!r}") from None
    return signals_of_lines(job, attempt, node, lines, matcher, rank=record.get("rank"))


def signals_of_lines(job: str, attempt: int, node: str, lines: list[Line], matcher: LineMatcher,
                     *, rank: int | None = None) -> list[Signal]:
    """An Output (liveness and tail) and one Hit per rule match for a batch of lines."""
    if not lines:
        return []
    batch: BatchResult = matcher.match_lines(lines, default_rank=rank)
    ranks = batch.ranks
    tail = tuple(TailLine(ranks[i] if i < len(ranks) else None, lines[i].ts, lines[i].text[:500])
                 for i in range(max(0, len(lines) - TAIL_LINES), len(lines)))
    out: list[Signal] = [Output(job=job, attempt=attempt, node=node, ts=lines[-1].ts,
                                count=len(lines), rank_last_ts=tuple(batch.rank_last_ts.items()),
                                tail=tail)]
    out.extend(Hit(job, attempt, node, m) for m in batch.matches)
    return out
