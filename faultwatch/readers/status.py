"""`faultwatch status`: the latest snapshot per job read back from the status topic, shown
as a table (once or live) or as JSON lines."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from faultwatch.core.status import STALE_S


def _fmt_age(x: Any) -> str:
    return "-" if x is None else f"{float(x):.0f}s"


def table(snapshots: Iterable[Mapping[str, Any]], now: float) -> Any:
    """A rich Table: one row per job."""
    from rich.table import Table

    t = Table(title=f"faultwatch status  {time.strftime('%H:%M:%S', time.gmtime(now))}Z",
              title_justify="left")
    for col in ("job", "run", "attempt", "phase", "nodes alive", "ranks", "quietest ranks",
                "stage", "window", "restarts", "last decisions", "age"):
        t.add_column(col, overflow="fold")
    for s in sorted(snapshots, key=lambda s: str(s.get("job"))):
        quiet = ", ".join(f"{'r' + str(r) if int(r) >= 0 else 'node'}:{_fmt_age(a)}"
                          for r, a in s.get("rank_last_output_age_s", [])[:3])
        window = s.get("window_s")
        phase = str(s.get("phase"))
        style = {"decided": "bold red", "settling": "yellow", "done": "dim"}.get(phase, "")
        t.add_row(str(s.get("job")), str(s.get("run_id"))[:24], str(s.get("attempt")), phase,
                  f"{s.get('nodes_alive')}/{s.get('expected_nodes') or s.get('nodes_total')}",
                  str(s.get("ranks_total")), quiet or "-",
                  ",".join(s.get("stages") or []) or "-",
                  "off" if window is None else f"{float(window):.0f}s ({s.get('window_basis')})",
                  str(s.get("restarts_used")),
                  " ".join(str(d)[:8] for d in s.get("decisions") or []) or "-",
                  _fmt_age(now - float(s.get("ts", now))), style=style)
    return t


async def read_status(bootstrap: str, topic: str, job: str | None = None,
                      must_exist: bool = True
                      ) -> tuple[dict[str, dict[str, Any]], dict[str, dict[str, Any]]]:
    """(the latest snapshot per job, the latest record per processor worker) on the
    compacted status topic, read to its end (worker records: streams/rules_status.py); a
    missing topic is a NotFoundError unless not `must_exist`."""
    from faultwatch import wire
    from faultwatch.errors import DecodeError
    from faultwatch.streams.rules_status import read_raw, split_status

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


async def read_snapshots(bootstrap: str, topic: str, job: str | None = None,
                         must_exist: bool = True) -> dict[str, dict[str, Any]]:
    """The latest snapshot per job on the compacted status topic (read to its end); a missing
    topic is a NotFoundError unless not `must_exist`."""
    return (await read_status(bootstrap, topic, job, must_exist=must_exist))[0]


def workers_table(workers: Iterable[Mapping[str, Any]], now: float) -> Any:
    """A rich Table: one row per processor worker and the rules it runs."""
    from rich.table import Table

    t = Table(title="processor workers (faultwatch rules show: layers and sources)",
              title_justify="left")
    for col in ("worker", "group", "rules version", "layers", "push", "refused", "age"):
        t.add_column(col, overflow="fold")
    for w in sorted(workers, key=lambda w: str(w.get("worker"))):
        rules = w.get("rules") or {}
        pushed: dict[str, Any] = next((la for la in rules.get("layers", [])
                                       if la.get("layer") == "pushed"), {})
        age = now - float(w.get("ts", now))
        t.add_row(str(w.get("worker")), str(w.get("group")), str(rules.get("version")),
                  "+".join(str(la.get("layer")) for la in rules.get("layers", [])),
                  f"{pushed.get('push_id', '-')} {pushed.get('author', '')}".strip(),
                  str((w.get("rejected") or {}).get("count", 0)), _fmt_age(age),
                  style="dim" if age > STALE_S else "")
    return t


def show(bootstrap: str, topic: str, *, job: str | None, as_json: bool, watch: bool,
         interval_s: float = 2.0, stop: Callable[[], bool] = lambda: False) -> int:
    """Print the snapshots once (table or JSON lines), or keep a live table until Ctrl-C
    (which waits for a status topic that does not exist yet)."""
    import orjson

    if as_json or not watch:
        snaps, workers = asyncio.run(read_status(bootstrap, topic, job))
        if job is not None:
            workers = {}  # one job's status: its snapshot only
        if as_json:
            for s in sorted(snaps.values(), key=lambda s: str(s.get("job"))):
                print(orjson.dumps(s).decode(), flush=True)
            for w in sorted(workers.values(), key=lambda w: str(w.get("worker"))):
                print(orjson.dumps(w).decode(), flush=True)
        else:
            from rich.console import Console

            Console().print(table(snaps.values(), time.time()))
            if workers:
                Console().print(workers_table(workers.values(), time.time()))
        return 0
    from rich.console import Group
    from rich.live import Live

    with Live(table([], time.time()), auto_refresh=False) as live:
        while not stop():
            snaps, workers = asyncio.run(read_status(bootstrap, topic, job, must_exist=False))
            now = time.time()
            shown = [table(snaps.values(), now)]
            if workers and job is None:
                shown.append(workers_table(workers.values(), now))
            live.update(Group(*shown), refresh=True)
            time.sleep(interval_s)
    return 0
