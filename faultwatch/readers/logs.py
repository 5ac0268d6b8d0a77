"""`faultwatch logs JOB`: a job's shipped lines from every node and rank, merged in time order
(readers/merge.py says the bound), with a separator where each attempt starts (and the
restart decision that caused it), exits, decisions and boot checks; filtered
(readers/select.py), followed, as coloured text on a terminal, plain text in a pipe, or JSON
lines (render.ROW_FIELDS)."""

from __future__ import annotations

import sys
import time
from collections import deque
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, TextIO

import orjson

from faultwatch.core.events import Exit
from faultwatch.errors import NotFoundError
from faultwatch.readers.merge import REORDER_WINDOW_S, Merger
from faultwatch.readers.select import LogFilter
from faultwatch.readers.timeline import (
    BOOTCHECK,
    EXIT,
    LINE,
    Row,
    Timeline,
    decision_row,
    start_row,
)

MAX_JOBS_NAMED = 10  # an unknown job's error names up to this many jobs the topic has


@dataclass(frozen=True)
class LogsQuery:
    """What to show: the job, the filter, follow or not, the last `tail` rows only, JSON."""

    job: str
    filt: LogFilter = field(default_factory=LogFilter)
    follow: bool = False
    tail: int | None = None
    as_json: bool = False
    window_s: float = REORDER_WINDOW_S


class _Printer:
    """Rows to the output: JSON lines, rich Text with colour on a terminal, plain text."""

    def __init__(self, out: TextIO, as_json: bool) -> None:
        from rich.console import Console

        self.out, self.as_json = out, as_json
        self.console = Console(file=out, highlight=False, markup=False, emoji=False,
                               soft_wrap=True)
        self.colour = self.console.color_system is not None and not as_json

    def write(self, rows: Iterable[Row]) -> None:
        from faultwatch.readers.render import render_plain, render_row, row_json

        for row in rows:
            if self.as_json:
                self.out.write(orjson.dumps(row_json(row)).decode() + "\n")
            elif self.colour:
                self.console.print(render_row(row))
            else:
                self.out.write(render_plain(row) + "\n")
        self.out.flush()


def show_logs(bootstrap: str, logs_topic: str, decisions_topic: str | None, q: LogsQuery,
              out: TextIO | None = None) -> int:
    """Print the job's rows; NotFoundError when the logs topic does not exist, or (not
    following, no --since) when it holds nothing of the job."""
    from faultwatch import wire
    from faultwatch.core.diagnosis import is_probe
    from faultwatch.kafka.reading import read_parts, report_bad_record, run_reader

    printer = _Printer(out or sys.stdout, q.as_json)
    merger: Merger[Row] = Merger(q.window_s)
    timeline = Timeline()
    tail: deque[Row] | None = deque(maxlen=q.tail) if q.tail is not None else None
    jobs: set[str] = set()  # the jobs seen (for the error naming what the topic has)
    known = [False]

    def show(rows: list[Row]) -> None:
        nonlocal tail
        kept = []
        for r in rows:
            shown = timeline.feed(r)
            if shown is not None and q.filt.keeps(shown):
                kept.append(shown)
        if tail is not None:
            tail.extend(kept)
        else:
            printer.write(kept)

    def rows_of(msg: Any) -> list[Row]:
        if msg.topic == decisions_topic:
            dec = wire.decode_decision(msg.value)
            return [decision_row(dec)] if dec.job == q.job and not is_probe(dec) else []
        d = wire.decode(msg.value)
        name = d.get("job")
        if name == q.job:
            known[0] = True
        elif isinstance(name, str) and len(jobs) < 1000:
            jobs.add(name)
        return rows_of_record(d, q.job)

    def batch(item: tuple[list[Any], dict[Any, bool]]) -> None:
        nonlocal tail
        records, at_end = item
        now = time.monotonic()
        for part, done in at_end.items():
            merger.partition(part, done)
        for msg in records:
            part = (msg.topic, msg.partition)
            if msg.timestamp is not None and msg.timestamp > 0:
                merger.advance(part, msg.timestamp / 1000)
            try:
                rows = rows_of(msg)
            except Exception as e:  # noqa: BLE001 - one bad record never stops the reader
                if msg.topic != decisions_topic:  # `faultwatch decisions` reports those
                    report_bad_record(msg, e)
                continue
            for r in rows:
                if r.kind != LINE or q.filt.keeps(r):  # drop filtered lines before holding
                    merger.push(part, r, now)
        caught_up = all(at_end.values())
        show(merger.pop(now, final=caught_up and (not q.follow or tail is not None)))
        if tail is not None and caught_up:  # the history is read: its last rows, then live
            printer.write(list(tail))
            tail = None

    topics = [logs_topic] + ([decisions_topic] if decisions_topic else [])
    code = run_reader(read_parts(bootstrap, topics, follow=q.follow, since_s=q.filt.since,
                                 hold=merger.ahead_of), batch)
    if not known[0] and not q.follow and q.filt.since is None:
        named = ", ".join(sorted(jobs)[:MAX_JOBS_NAMED]) or "none"
        raise NotFoundError(f"no record of job {q.job!r} on {logs_topic} (jobs there: "
                            f"{named}{', ...' if len(jobs) > MAX_JOBS_NAMED else ''})")
    return code


def exit_row(ev: Exit) -> Row:
    from faultwatch.agents.exitcodes import signal_name

    if ev.stopped:
        text = f"stopped by faultwatch (code {ev.exit_code})"
    elif ev.signal:
        text = f"killed by {signal_name(ev.signal)} (code {ev.exit_code})"
    else:
        text = f"exited with code {ev.exit_code}"
    return Row(EXIT, ev.ts, ev.job, ev.run_id, ev.attempt, text, node=ev.node,
               data={"exit_code": ev.exit_code, "signal": ev.signal, "stopped": ev.stopped})


def rows_of_record(d: Mapping[str, Any], job: str) -> list[Row]:
    """The rows of one decoded logs-topic record of `job` (others: none): its lines (the
    rank prefix torchrun adds moved to `rank`), a run start, an exit, a boot-check note.
    DecodeError when a field is malformed."""
    from faultwatch.registry.checks import checks_of, render_checks
    from faultwatch.rules.prefix import strip_rank
    from faultwatch.wire import exit_of, lines_batch_of, lines_of, run_start_of
    from faultwatch.wire.events import notice_of

    if d.get("job") != job:
        return []
    t = d.get("t")
    if t == "lines":
        b = lines_batch_of(d)
        out = []
        for ln in lines_of(d):
            rank, text = strip_rank(ln.text, b.rank)
            out.append(Row(LINE, ln.ts, job, b.run_id, b.attempt, text, node=b.node, rank=rank,
                           stream=ln.stream, seq=ln.seq, flags=ln.flags))
        return out
    if t == "start":
        return [start_row(run_start_of(d))]
    if t == "exit":
        return [exit_row(exit_of(d))]
    if t == "note" and d.get("kind") == "bootcheck":
        n = notice_of(d)
        return [Row(BOOTCHECK, n.ts, job, n.run_id, n.attempt, render_checks(n.data),
                    node=n.node, stream="bootcheck", data={"checks": checks_of(n.data)})]
    return []
