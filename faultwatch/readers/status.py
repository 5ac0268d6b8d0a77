"""`faultwatch status`: the latest snapshot per job read back from the status topic, shown
as a table (once or live: on a terminal fitted to its width; in a pipe or file one row per
line, nothing cut, a block per refresh) or as JSON lines."""

from __future__ import annotations

import asyncio
import os
import sys
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

from faultwatch.core.status import STALE_S
from faultwatch.errors import NotFoundError

FINISHED_FOR_S = 3600.0  # `status` shows a finished job this long after its last snapshot
ACTIVE_PHASES = ("running", "settling")


def _fmt_age(x: Any) -> str:
    """Seconds as kubectl prints an AGE (45s, 3m12s, 5h12m, 3d4h); `-` for none."""
    from faultwatch.readers.render import age

    return "-" if x is None else age(float(x))


def visible(snapshots: Iterable[Mapping[str, Any]], now: float, finished_for_s: float
            ) -> tuple[list[Mapping[str, Any]], int]:
    """(the snapshots `status` lists, how many finished jobs it hides): a job that is not
    running or settling (decided, done) is listed for `finished_for_s` after its last
    snapshot (the processor publishes one when a job leaves the active phases), then aged
    out. Ordered by job."""
    shown, hidden = [], 0
    for s in sorted(snapshots, key=lambda s: str(s.get("job"))):
        if (str(s.get("phase")) not in ACTIVE_PHASES
                and now - float(s.get("ts", now)) > finished_for_s):
            hidden += 1
        else:
            shown.append(s)
    return shown, hidden


def _quiet(s: Mapping[str, Any], n: int) -> str:
    return " ".join(f"{'r' + str(r) if int(r) >= 0 else 'node'}:{_fmt_age(a)}"
                    for r, a in s.get("rank_last_output_age_s", [])[:n]) or "-"


def _window(s: Mapping[str, Any]) -> str:
    window = s.get("window_s")
    return "off" if window is None else f"{float(window):.0f}s ({s.get('window_basis')})"


def _nodes(s: Mapping[str, Any]) -> str:
    return f"{s.get('nodes_alive')}/{s.get('expected_nodes') or s.get('nodes_total')}"


PHASE_STYLE = {"decided": "bold red", "settling": "yellow", "done": "dim"}


def _phase(s: Mapping[str, Any]) -> str:
    """`running`, or with an operator's hold or mute `running,held,muted` (as kubectl shows
    a cordoned node `Ready,SchedulingDisabled`)."""
    marks = {"hold": "held", "mute": "muted"}
    return ",".join([str(s.get("phase")), *(marks.get(str(h.get("kind")), "?")
                                            for h in s.get("holds") or ())])


def with_holds(snapshots: Mapping[str, dict[str, Any]], holds: Iterable[Any]
               ) -> dict[str, dict[str, Any]]:
    """The snapshots with `holds`: the operators' holds and mutes in force on each job
    (core.holds.Hold, read from the holds topic by `status`; a snapshot never holds them)."""
    by_job: dict[str, list[dict[str, Any]]] = {}
    for h in holds:
        by_job.setdefault(h.job, []).append(h.to_dict())
    return {job: ({**s, "holds": by_job[job]} if job in by_job else s)
            for job, s in snapshots.items()}


def compact_cells(s: Mapping[str, Any], now: float) -> list[str]:
    """One job's cells under COMPACT (the 80-column table)."""
    decisions = s.get("decisions") or []
    return [str(s.get("job")), _phase(s), str(s.get("attempt")), _nodes(s),
            str(s.get("restarts_used")), _quiet(s, 2), _fmt_age(now - float(s.get("ts", now))),
            str(s.get("run_id")), str(s.get("ranks_total")), _window(s),
            str(decisions[-1])[:12] if decisions else "-"]


def _compact_columns() -> list[Any]:
    from faultwatch.readers.columns import Column

    return [Column("job", 0, 20, middle=True), Column("phase"), Column("att"),
            Column("nodes"), Column("rst", 3), Column("quietest", 4, 15), Column("age", 2),
            Column("run", 5, 12, middle=True), Column("ranks", 6), Column("window", 7, 12),
            Column("last decision", 8, 8)]


WIDE = ("job", "run", "attempt", "phase", "nodes alive", "ranks", "quietest ranks", "stage",
        "window", "restarts", "last decisions", "age")


def wide_cells(s: Mapping[str, Any], now: float) -> list[str]:
    """One job's cells under WIDE (`--wide`: every column, nothing cut)."""
    return [str(s.get("job")), str(s.get("run_id")), str(s.get("attempt")),
            _phase(s), _nodes(s), str(s.get("ranks_total")), _quiet(s, 3),
            ",".join(s.get("stages") or []) or "-", _window(s), str(s.get("restarts_used")),
            " ".join(str(d)[:8] for d in s.get("decisions") or []) or "-",
            _fmt_age(now - float(s.get("ts", now)))]


def title_of(now: float, hidden: int) -> str:
    title = f"faultwatch status  {time.strftime('%H:%M:%S', time.gmtime(now))}Z"
    if hidden:
        title += f"  ({hidden} finished job{'s' if hidden > 1 else ''} hidden)"
    return title


def lines(snapshots: Iterable[Mapping[str, Any]], now: float, width: int | None = None,
          wide: bool = False, hidden: int = 0) -> list[str]:
    """The table as plain lines (a pipe, a file): the title, the header and one line per
    job, aligned, no trailing spaces. `width` fits the default columns into it (as on a
    terminal); None keeps every cell whole. `wide`: every column, whole."""
    from faultwatch.eventlog import clean
    from faultwatch.readers.columns import abbreviate, fit, plain_lines

    snaps = list(snapshots)
    title = title_of(now, hidden)
    if wide:
        return [title, *plain_lines(WIDE, [[clean(c) for c in wide_cells(s, now)]
                                           for s in snaps])]
    cells = [[clean(c) for c in compact_cells(s, now)] for s in snaps]
    cols = _compact_columns()
    if width is not None:
        cols, cells = fit(cols, cells, width)
        title = abbreviate(title, width)
    return [title, *plain_lines([c.name for c in cols], cells)]


def table(snapshots: Iterable[Mapping[str, Any]], now: float, width: int = 80,
          wide: bool = False, hidden: int = 0) -> Any:
    """For a terminal, one row per job, coloured by phase: fitted into `width` columns (job
    and run names abbreviated in the middle, the least useful columns dropped:
    readers/columns.py), or with `wide` every column in full, never wrapped by us (a
    narrower terminal wraps the lines itself, as with `kubectl get -o wide`). `hidden`
    finished jobs are counted in the title."""
    from rich.table import Table
    from rich.text import Text

    snaps = list(snapshots)
    if wide:
        text = Text(no_wrap=True, overflow="ignore")
        out = lines(snaps, now, wide=True, hidden=hidden)
        text.append(out[0] + "\n" + out[1], style="bold")
        for s, line in zip(snaps, out[2:], strict=True):
            text.append("\n" + line, style=PHASE_STYLE.get(str(s.get("phase")), ""))
        return text
    title = title_of(now, hidden)
    from faultwatch.eventlog import clean
    from faultwatch.readers.columns import fit

    cols, rows = fit(_compact_columns(), [[clean(c) for c in compact_cells(s, now)]
                                          for s in snaps], width)
    t = Table(title=abbreviate_title(title, width), title_justify="left", box=None,
              pad_edge=False, padding=(0, 1), header_style="bold")
    for c in cols:
        t.add_column(c.name, no_wrap=True, overflow="ellipsis")
    for s, row in zip(snaps, rows, strict=True):
        t.add_row(*row, style=PHASE_STYLE.get(str(s.get("phase")), ""))
    return t


def abbreviate_title(title: str, width: int) -> str:
    from faultwatch.readers.columns import abbreviate

    return abbreviate(title, width)


async def read_status(bootstrap: str, topic: str, job: str | None = None,
                      must_exist: bool = True
                      ) -> tuple[dict[str, dict[str, Any]], dict[str, dict[str, Any]]]:
    """(the latest snapshot per job, the latest record per processor worker) on the
    compacted status topic, read to its end (worker records: rollout/rules_status.py); a
    missing topic is a NotFoundError unless not `must_exist`."""
    from faultwatch import wire
    from faultwatch.errors import DecodeError
    from faultwatch.rollout.rules_status import read_raw, split_status

    jobs, workers = split_status(await read_raw(bootstrap, topic, must_exist=must_exist))
    latest: dict[str, dict[str, Any]] = {}
    for value in jobs:
        try:
            snap = wire.decode_status(value)
            name = str(snap["job"])
        except (KeyError, TypeError, DecodeError):
            continue
        if job is None or name == job:
            latest[name] = snap
    return latest, workers


async def read_holds_in_force(bootstrap: str, topic: str | None, now: float) -> list[Any]:
    """The holds and mutes in force (core.holds.Hold) on the holds topic (none: missing)."""
    if topic is None:
        return []
    from faultwatch.holds.store import load_holds

    return (await load_holds(bootstrap, topic)).in_force(now)


async def read_snapshots(bootstrap: str, topic: str, job: str | None = None,
                         must_exist: bool = True) -> dict[str, dict[str, Any]]:
    """The latest snapshot per job on the compacted status topic (read to its end); a missing
    topic is a NotFoundError unless not `must_exist`."""
    return (await read_status(bootstrap, topic, job, must_exist=must_exist))[0]


WORKERS = ("worker", "group", "rules version", "layers", "push", "refused", "age")
WORKERS_TITLE = "processor workers (faultwatch rules show: layers and sources)"


def worker_cells(w: Mapping[str, Any], now: float) -> list[str]:
    from faultwatch.rollout.rules_status import refused_count

    rules = w.get("rules") or {}
    pushed: dict[str, Any] = next((la for la in rules.get("layers", [])
                                   if la.get("layer") == "pushed"), {})
    return [str(w.get("worker")), str(w.get("group")), str(rules.get("version")),
            "+".join(str(la.get("layer")) for la in rules.get("layers", [])),
            f"{pushed.get('push_id', '-')} {pushed.get('author', '')}".strip(),
            str(refused_count(w)), _fmt_age(now - float(w.get("ts", now)))]


def worker_lines(workers: Iterable[Mapping[str, Any]], now: float) -> list[str]:
    """The processor workers and the rules each runs, as plain aligned lines (title first):
    one line per worker, no cell cut or split."""
    from faultwatch.eventlog import clean
    from faultwatch.readers.columns import plain_lines

    ws = sorted(workers, key=lambda w: str(w.get("worker")))
    return [WORKERS_TITLE, *plain_lines(WORKERS, [[clean(c) for c in worker_cells(w, now)]
                                                  for w in ws])]


def workers_table(workers: Iterable[Mapping[str, Any]], now: float) -> Any:
    """For a terminal: worker_lines, a stale worker dimmed, never wrapped by us."""
    from rich.text import Text

    ws = sorted(workers, key=lambda w: str(w.get("worker")))
    out = worker_lines(ws, now)
    text = Text(no_wrap=True, overflow="ignore")
    text.append(out[0] + "\n" + out[1], style="bold")
    for w, line in zip(ws, out[2:], strict=True):
        stale = now - float(w.get("ts", now)) > STALE_S
        text.append("\n" + line, style="dim" if stale else "")
    return text


def _block(shown: Sequence[Mapping[str, Any]], workers: Mapping[str, Mapping[str, Any]],
           now: float, width: int | None, wide: bool, hidden: int) -> str:
    """One refresh for a pipe or a file: the jobs' lines, then the workers' if any."""
    out = lines(shown, now, width, wide, hidden)
    if workers:
        out += ["", *worker_lines(workers.values(), now)]
    return "\n".join(out) + "\n"


async def read_view(bootstrap: str, topic: str, job: str | None, holds_topic: str | None,
                    must_exist: bool = True
                    ) -> tuple[dict[str, dict[str, Any]], dict[str, dict[str, Any]]]:
    """read_status, each snapshot with the holds and mutes in force on its job."""
    snaps, workers = await read_status(bootstrap, topic, job, must_exist=must_exist)
    if snaps and holds_topic is not None:
        snaps = with_holds(snaps, await read_holds_in_force(bootstrap, holds_topic,
                                                            time.time()))
    return snaps, workers


def show(bootstrap: str, topic: str, *, job: str | None, as_json: bool, watch: bool,
         interval_s: float = 2.0, wide: bool = False,
         finished_for_s: float = FINISHED_FOR_S, stop: Callable[[], bool] = lambda: False,
         holds_topic: str | None = None) -> int:
    """Print the snapshots once (table or JSON lines), or keep a live table until Ctrl-C
    (which waits for a status topic that does not exist yet). Finished jobs age out
    (`visible`) unless `job` names one; a `job` no processor reports is a NotFoundError
    (exit 7) when not watching. With `holds_topic`, each job shows its holds and mutes."""
    import orjson
    from rich.console import Console

    console = Console(highlight=False)
    terminal = console.is_terminal
    # a pipe or a file gets whole cells unless COLUMNS asks for a width (`watch` sets it)
    width = console.width if terminal or os.environ.get("COLUMNS") else None
    if as_json or not watch:
        snaps, workers = asyncio.run(read_view(bootstrap, topic, job, holds_topic))
        if job is not None:
            if job not in snaps:
                raise NotFoundError(f"no processor reports job {job!r} on {topic} (a job "
                                    "is known once its agents' records are processed; "
                                    "`faultwatch status` lists the jobs)")
            workers = {}  # one job's status: its snapshot only
        now = time.time()
        shown, hidden = (list(snaps.values()), 0) if job is not None else \
            visible(snaps.values(), now, finished_for_s)
        if as_json:
            for s in shown:
                print(orjson.dumps(s).decode(), flush=True)
            for w in sorted(workers.values(), key=lambda w: str(w.get("worker"))):
                print(orjson.dumps(w).decode(), flush=True)
        elif terminal:
            console.print(table(shown, now, console.width, wide, hidden))
            if workers:
                console.print(workers_table(workers.values(), now))
        else:
            sys.stdout.write(_block(shown, workers, now, width, wide, hidden))
            sys.stdout.flush()
        return 0

    def view() -> tuple[list[Mapping[str, Any]], dict[str, dict[str, Any]], float, int]:
        snaps, workers = asyncio.run(read_view(bootstrap, topic, job, holds_topic,
                                               must_exist=False))
        now = time.time()
        shown: list[Mapping[str, Any]] = list(snaps.values())
        hidden = 0
        if job is None:
            shown, hidden = visible(snaps.values(), now, finished_for_s)
        return shown, workers if job is None else {}, now, hidden

    if not terminal:  # a pipe or a file: a block per refresh, a blank line between blocks
        first = True
        while not stop():
            shown, workers, now, hidden = view()
            sys.stdout.write(("" if first else "\n") + _block(
                shown, workers, now, width, wide, hidden))
            sys.stdout.flush()
            first = False
            time.sleep(interval_s)
        return 0
    from rich.console import Group
    from rich.live import Live

    with Live(table([], time.time(), console.width, wide), auto_refresh=False,
              console=console) as live:
        while not stop():
            shown, workers, now, hidden = view()
            parts = [table(shown, now, console.width, wide, hidden)]
            if workers:
                parts.append(workers_table(workers.values(), now))
            live.update(Group(*parts), refresh=True)
            time.sleep(interval_s)
    return 0
