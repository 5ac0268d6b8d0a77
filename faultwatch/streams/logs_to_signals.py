"""The matcher stage's glue: one decoded logs-topic record in, the job signals it implies out."""

from __future__ import annotations

from faultwatch.core.events import Exit, Notice, Signal
from faultwatch.core.matching import LineMatcher, signals_of_exit, signals_of_lines
from faultwatch.wire import LinesBatch, LogsRecord

# note kinds the job state uses as they are (progress and stage notes arrive as signals)
NOTICE_KINDS = ("notify", "retryable_errors", "bootcheck", "gap", "spawn_failed",
                "diagnosis", "spare")


def signals_of_record(rec: LogsRecord, matcher: LineMatcher) -> list[Signal]:
    """Signals for one logs-topic record (wire.decode_logs validated it): a batch of lines
    becomes an Output and its hits, progress and stages; an exit gets the hit of an exit
    rule; a note of a kind this processor does not know (a newer agent) is dropped."""
    if isinstance(rec, LinesBatch):
        return signals_of_lines(rec.job, rec.attempt, rec.node, rec.lines, matcher,
                                rank=rec.rank, run_id=rec.run_id)
    if isinstance(rec, Exit):
        return signals_of_exit(rec, matcher)
    if isinstance(rec, Notice):
        return [rec] if rec.kind in NOTICE_KINDS else []
    return [rec]
