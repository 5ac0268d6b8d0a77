"""`faultwatch status`: per-job snapshots the processors publish, read back and shown live."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from faultwatch.core.policy import Policy
from faultwatch.core.state import JobState, thaw
from faultwatch.core.windows import choose_window

STATUS_S = 3.0  # how often a processor looks for snapshots to publish (streams/status_publish.py)
MAX_RANKS_SHOWN = 64  # per snapshot: the quietest ranks first
MAX_DECISIONS_SHOWN = 5


def _age(now: float, ts: float | None) -> float | None:
    return None if ts is None else round(max(0.0, now - ts), 1)


def snapshot(st: JobState, now: float, policy: Policy) -> dict[str, Any]:
    """What `status` shows of one job: run, attempt, nodes and ranks alive, last output age
    per rank (quietest first), open stages and the silence window in effect, decisions."""
    stages = st.open_stages()
    window, basis = choose_window(policy, stages, st.hists, st.warmed_up)
    nodes = [{"node": n.node, "rank": n.rank, "alive": n.alive, "exit_code": n.exit_code,
              "last_output_age_s": _age(now, n.last_output_ts),
              "last_heartbeat_age_s": _age(now, n.last_hb_ts)}
             for n in sorted(st.nodes.values(), key=lambda n: n.node)]
    ranks = sorted(st.rank_last_ts.items(), key=lambda kv: kv[1])[:MAX_RANKS_SHOWN]
    return {"job": st.job, "run_id": st.run_id, "run_source": st.run_source,
            "scheduler": thaw(st.scheduler), "attempt": st.attempt, "phase": str(st.phase),
            "ts": now, "nodes_alive": sum(1 for n in st.nodes.values() if n.alive),
            "nodes_total": len(st.nodes), "expected_nodes": st.expected_nodes,
            "ranks_total": len(st.rank_last_ts), "expected_world": st.expected_world,
            "rank_last_output_age_s": [[r, _age(now, ts)] for r, ts in ranks],
            "last_output_age_s": _age(now, st.last_output_ts),
            "stages": sorted({s.stage for s in stages}), "window_s": window,
            "window_basis": basis.get("basis"), "steps": st.steps,
            "restarts_used": st.restarts_used,
            "decisions": list(st.decided[-MAX_DECISIONS_SHOWN:]), "nodes": nodes}


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


async def read_snapshots(bootstrap: str, topic: str, job: str | None = None
                         ) -> dict[str, dict[str, Any]]:
    """The latest snapshot per job on the compacted status topic (read to its end)."""
    from faultwatch import wire
    from faultwatch.errors import DecodeError
    from faultwatch.kafka.reading import read_topic

    latest: dict[str, dict[str, Any]] = {}
    async for _msg, snap in read_topic(bootstrap, topic, decoder=wire.decode_status):
        try:
            name = str(snap["job"])
        except (KeyError, TypeError, DecodeError):
            continue
        if job is None or name == job:
            latest[name] = snap
    return latest


def run(bootstrap: str, topic: str, *, job: str | None, as_json: bool, watch: bool,
        interval_s: float = 2.0, stop: Callable[[], bool] = lambda: False) -> int:
    """Print the snapshots once (table or JSON lines), or keep a live table until Ctrl-C."""
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
            snaps = asyncio.run(read_snapshots(bootstrap, topic, job))
            live.update(table(snaps.values(), time.time()), refresh=True)
            time.sleep(interval_s)
    return 0
