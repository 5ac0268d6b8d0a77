"""Lines to signals: what a node's lines (or exit) imply for its job; pure, no record format."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol

from faultwatch.core.events import (
    Exit,
    Hit,
    Line,
    LossBatch,
    Match,
    Output,
    ProgressBatch,
    RankLoss,
    RankStep,
    Signal,
    Stage,
    TailLine,
    line_times,
)

TAIL_LINES = 8  # last lines of a batch forwarded as silence evidence
TAIL_CHARS = 500  # ... each cut to this (retryable patterns are searched in the tail)


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
    step: int | None


class LossLike(Protocol):
    rank: int | None
    ts: float
    value: float
    key: str


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


def signals_of_lines(job: str, attempt: int, node: str, lines: Sequence[Line],
                     matcher: LineMatcher, *, rank: int | None = None,
                     run_id: str = "") -> list[Signal]:
    """An Output (liveness and tail), one Hit per rule match, the stages, one
    ProgressBatch with every rank's last step (when a progress rule matched) and one
    LossBatch with the training-loss values printed (if any) for a batch of lines."""
    if not lines:
        return []
    batch: BatchResult = matcher.match_lines(lines, default_rank=rank)
    ranks = batch.ranks
    n = len(lines)
    lo = max(0, n - TAIL_LINES)
    # (a decoded record's rows keep texts and times as columns: no Line built for the tail)
    texts: Sequence[str] | None = getattr(lines, "texts", None)
    last_texts = [ln.text for ln in lines[lo:]] if texts is None else texts[lo:]
    times = line_times(lines)
    tail = tuple(TailLine(ranks[i] if i < len(ranks) else None, times[i], text[:TAIL_CHARS])
                 for i, text in enumerate(last_texts, lo))
    out: list[Signal] = [Output(job=job, attempt=attempt, node=node, ts=times[n - 1],
                                count=n, rank_last_ts=tuple(batch.rank_last_ts.items()),
                                tail=tail, run_id=run_id)]
    out.extend(Hit(job, attempt, node, m, run_id) for m in batch.matches)
    out.extend(Stage(job, attempt, node, st.ts, st.rank, st.stage, st.opens, st.hang_window_s,
                     run_id=run_id, step=getattr(st, "step", None))
               for st in getattr(batch, "stages", ()))
    marks = getattr(batch, "progress", ())
    if marks:
        out.append(ProgressBatch(job, attempt, node,
                                 tuple(RankStep(p.rank, p.ts, p.step, p.total) for p in marks),
                                 run_id))
    losses: tuple[LossLike, ...] = getattr(batch, "losses", ())
    if losses:
        out.append(LossBatch(job, attempt, node,
                             tuple(RankLoss(x.rank, x.ts, x.value, x.key) for x in losses),
                             run_id))
    return out


def signals_of_exit(ev: Exit, matcher: LineMatcher) -> list[Signal]:
    """The exit, preceded by the Hit of an exit rule that matches its status (if any)."""
    if ev.stopped:  # an operator stopped it: no exit rule applies
        return [ev]
    m = matcher.match_exit(ev.exit_code, ev.signal, ev.ts)
    out: list[Signal] = [] if m is None else [Hit(ev.job, ev.attempt, ev.node, m, ev.run_id)]
    return out + [ev]
