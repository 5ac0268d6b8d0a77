"""The matcher stage: one decoded logs-topic record in, the job signals it implies out."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol

from faultwatch.core.events import (
    Hit,
    Line,
    Match,
    Notice,
    Output,
    Progress,
    Signal,
    Stage,
    TailLine,
)
from faultwatch.errors import DecodeError
from faultwatch.wire import exit_of, heartbeat_of, line_rows, notice_of, run_start_of

TAIL_LINES = 8  # last lines of a batch forwarded as silence evidence
TAIL_CHARS = 500  # ... each cut to this (retryable patterns are searched in the tail)
# note kinds the job state uses as they are (progress and stage notes become signals)
NOTICE_KINDS = ("notify", "retryable_errors", "bootcheck", "gap", "spawn_failed")


class ProgressLike(Protocol):
    rank: int | None
    ts: float
    step: int
    total: int | None


class StageLike(Protocol):
    rank: int | None
    ts: float
    stage: str
    opens: bool
    hang_window_s: float | None


class BatchResult(Protocol):
    matches: tuple[Match, ...]
    rank_last_ts: dict[int | None, float]
    ranks: tuple[int | None, ...]

    @property
    def progress(self) -> tuple[ProgressLike, ...]: ...

    @property
    def stages(self) -> tuple[StageLike, ...]: ...


class LineMatcher(Protocol):
    def match_lines(self, lines: Sequence[Line], *, default_rank: int | None = None) -> Any: ...

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
        return _note(notice_of(record))
    raise DecodeError(f"unknown record type {t!r}")


def _lines(record: dict[str, Any], matcher: LineMatcher) -> list[Signal]:
    lines = line_rows(record)
    try:
        job, attempt, node = str(record["job"]), int(record["attempt"]), str(record["node"])
    except (KeyError, TypeError, ValueError) as e:
        raise DecodeError(f"malformed lines record: {e!r}") from None
    return signals_of_lines(job, attempt, node, lines, matcher, rank=record.get("rank"))


def signals_of_lines(job: str, attempt: int, node: str, lines: Sequence[Line],
                     matcher: LineMatcher, *, rank: int | None = None) -> list[Signal]:
    """An Output (liveness and tail) and one Hit per rule match for a batch of lines."""
    if not lines:
        return []
    batch: BatchResult = matcher.match_lines(lines, default_rank=rank)
    ranks = batch.ranks
    tail = tuple(TailLine(ranks[i] if i < len(ranks) else None, lines[i].ts,
                           lines[i].text[:TAIL_CHARS])
                 for i in range(max(0, len(lines) - TAIL_LINES), len(lines)))
    out: list[Signal] = [Output(job=job, attempt=attempt, node=node, ts=lines[-1].ts,
                                count=len(lines), rank_last_ts=tuple(batch.rank_last_ts.items()),
                                tail=tail)]
    out.extend(Hit(job, attempt, node, m) for m in batch.matches)
    out.extend(Stage(job, attempt, node, st.ts, st.rank, st.stage, st.opens, st.hang_window_s)
               for st in getattr(batch, "stages", ()))
    out.extend(Progress(job, attempt, node, p.ts, p.rank, p.step, p.total)
               for p in getattr(batch, "progress", ()))
    return out


def _note(n: Notice) -> list[Signal]:
    """SDK/agent notes: progress and stage notes become signals; others pass through."""
    d: dict[str, Any] = dict(n.data)
    try:
        if n.kind == "progress":
            st = d.get("step_time_s")
            rank = d.get("rank")
            return [Progress(n.job, n.attempt, n.node, n.ts, None if rank is None else int(rank),
                             int(d["step"]),
                             total=None if d.get("total") is None else int(d["total"]),
                             step_time_s=None if st is None else float(st), source="sdk")]
        if n.kind == "stage":
            hw = d.get("hang_window_s")
            rank = d.get("rank")
            return [Stage(n.job, n.attempt, n.node, n.ts, None if rank is None else int(rank),
                          str(d["stage"]), bool(d.get("opens", True)),
                          None if hw is None else float(hw), source="sdk")]
    except (KeyError, TypeError, ValueError) as e:
        raise DecodeError(f"malformed {n.kind} note: {e!r}") from None
    if n.kind in NOTICE_KINDS:
        return [n]
    return []  # a note kind this processor does not know: newer agent, ignore
