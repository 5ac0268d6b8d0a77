"""`faultwatch status`: the latest snapshot per job read back from the status topic, shown
as a table (once or live) or as JSON lines."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Iterable, Mapping
from typing import Any


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


async def read_snapshots(bootstrap: str, topic: str, job: str | None = None,
                         must_exist: bool = True) -> dict[str, dict[str, Any]]:
    """The latest snapshot per job on the compacted status topic (read to its end); a missing
    topic is a NotFoundError unless not `must_exist`."""
    from faultwatch import wire
    from faultwatch.errors import DecodeError
    from faultwatch.kafka.reading import read_topic

    latest: dict[str, dict[str, Any]] = {}
    async for _msg, snap in read_topic(bootstrap, topic, decoder=wire.decode_status,
                                       must_exist=must_exist):
        try:
            name = str(snap["job"])
        except (KeyError, TypeError, DecodeError):
            continue
        if job is None or name == job:
            latest[name] = snap
    return latest


def show(bootstrap: str, topic: str, *, job: str | None, as_json: bool, watch: bool,
         interval_s: float = 2.0, stop: Callable[[], bool] = lambda: False) -> int:
    """Print the snapshots once (table or JSON lines), or keep a live table until Ctrl-C
    (which waits for a status topic that does not exist yet)."""
    import orjson

    if as_json or not watch:
        snaps = asyncio.run(read_snapshots(bootstrap, topic, job))
        if as_json:
            for s in sorted(snaps.values(), key=lambda s: str(s.get("job"))):
                print(orjson.dumps(s).decode(), flush=True)
        else:
            from rich.console import Console

            Console().print(table(snaps.values(), time.time()))
        return 0
    from rich.live import Live

    with Live(table([], time.time()), auto_refresh=False) as live:
        while not stop():
            snaps = asyncio.run(read_snapshots(bootstrap, topic, job, must_exist=False))
            live.update(table(snaps.values(), time.time()), refresh=True)
            time.sleep(interval_s)
    return 0
