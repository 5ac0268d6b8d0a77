"""Lifecycle and notes: run starts, heartbeats, exits and notices, the same shape on the logs
and the signals topic, and the Progress/Stage signals an SDK note stands for."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import asdict
from typing import Any

import orjson

from faultwatch.core.events import Exit, Heartbeat, Notice, Progress, RunStart, Stage
from faultwatch.wire._check import (
    MAX_EXIT_CODE,
    MAX_ID_CHARS,
    MAX_RANK,
    MAX_SIGNAL,
    MAX_STEP,
    MAX_TS,
    MIN_EXIT_CODE,
    SCHEMA_VERSION,
    _bool,
    _get,
    _Head,
    _head,
    _int,
    _json_obj,
    _list,
    _opt_int,
    _opt_num,
    _scheduler,
    _text,
    safe_name,
)


def run_start_dict(ev: RunStart) -> dict[str, Any]:
    """A run start as a plain dict (without the schema version): the same on the logs and
    the signals topic."""
    d = asdict(ev)
    d["local_ranks"] = list(ev.local_ranks)
    d["cmd"] = list(ev.cmd)
    return {"t": "start", **d}


def encode_run_start(ev: RunStart) -> bytes:
    return orjson.dumps({"v": SCHEMA_VERSION, **run_start_dict(ev)})


def run_start_of(d: Mapping[str, Any]) -> RunStart:
    h = _head(d, "start")
    return RunStart(
        job=h.job, attempt=h.attempt, node=h.node, ts=h.ts, run_id=h.run_id,
        world_size=_opt_int(d.get("world_size"), "start.world_size", 1, MAX_RANK),
        nnodes=_opt_int(d.get("nnodes"), "start.nnodes", 1, MAX_RANK),
        rank=_opt_int(d.get("rank"), "start.rank", 0, MAX_RANK),
        local_ranks=tuple(_int(r, "start.local_ranks", 0, MAX_RANK)
                          for r in _list(d.get("local_ranks") or [], "start.local_ranks")),
        host=_text(d.get("host", ""), "start.host", MAX_ID_CHARS),
        pid=_int(d.get("pid", 0), "start.pid", 0, 2**31),
        cmd=tuple(_text(w, "start.cmd") for w in _list(d.get("cmd") or [], "start.cmd")),
        agent_version=_text(d.get("agent_version", ""), "start.agent_version", MAX_ID_CHARS),
        run_source=safe_name(d.get("run_source", ""), "start.run_source", empty_ok=True),
        scheduler=_scheduler(d.get("scheduler") or {}, "start"))


def encode_heartbeat(ev: Heartbeat, run_id: str = "", stats: Mapping[str, object] | None = None
                     ) -> bytes:
    return orjson.dumps({"v": SCHEMA_VERSION, **asdict(ev), "t": "hb",
                         "run_id": run_id or ev.run_id, "stats": dict(stats or {})})


def heartbeat_of(d: Mapping[str, Any]) -> Heartbeat:
    h = _head(d, "hb")
    return Heartbeat(job=h.job, attempt=h.attempt, node=h.node, ts=h.ts,
                     alive=_bool(_get(d, "alive", "hb"), "hb.alive"),
                     last_output_ts=_opt_num(d.get("last_output_ts"), "hb.last_output_ts"),
                     started_ts=_opt_num(d.get("started_ts"), "hb.started_ts"), run_id=h.run_id)


def encode_exit(ev: Exit, run_id: str = "") -> bytes:
    return orjson.dumps({"v": SCHEMA_VERSION, **asdict(ev), "t": "exit",
                         "run_id": run_id or ev.run_id})


def exit_of(d: Mapping[str, Any]) -> Exit:
    h = _head(d, "exit")
    return Exit(job=h.job, attempt=h.attempt, node=h.node, ts=h.ts,
                exit_code=_int(_get(d, "exit_code", "exit"), "exit.exit_code", MIN_EXIT_CODE,
                               MAX_EXIT_CODE),
                signal=_opt_int(d.get("signal"), "exit.signal", 1, MAX_SIGNAL), run_id=h.run_id,
                stopped=d.get("stopped") is True)


def encode_notice(job: str, attempt: int, node: str, ts: float, kind: str,
                  data: dict[str, Any], run_id: str = "") -> bytes:
    """Agent-side notices (gaps, SDK messages, boot checks) travel as `note` records."""
    d: dict[str, Any] = {"v": SCHEMA_VERSION, "t": "note", "job": job, "attempt": attempt,
                         "node": node, "ts": ts, "kind": kind, "data": data}
    if run_id:
        d["run_id"] = run_id
    return orjson.dumps(d)


def notice_of(d: Mapping[str, Any]) -> Notice:
    h = _head(d, "note")
    return Notice(job=h.job, attempt=h.attempt, node=h.node, ts=h.ts,
                  kind=safe_name(_get(d, "kind", "note"), "note.kind"),
                  data=_json_obj(d.get("data") or {}, "note.data"), run_id=h.run_id)


_NONFINITE = {"nan": math.nan, "inf": math.inf, "-inf": -math.inf}


def loss_of(x: Any) -> float | None:
    """A loss value as the SDK or a signal carries it: a number, or "nan" / "inf" / "-inf"
    (the SDK's str() of a non-finite float; JSON has no NaN). Anything else: None."""
    if type(x) is str:
        return _NONFINITE.get(x.strip().lower())
    if type(x) in (int, float):
        return float(x)
    return None


def _progress(h: _Head, d: Mapping[str, Any], where: str, source: str) -> Progress:
    metrics = d.get("metrics")
    loss = loss_of(d["loss"]) if "loss" in d else \
        loss_of(metrics.get("loss")) if isinstance(metrics, dict) else None
    return Progress(h.job, h.attempt, h.node, h.ts, _opt_int(d.get("rank"), f"{where}.rank", 0,
                                                             MAX_RANK),
                    _int(_get(d, "step", where), f"{where}.step", -MAX_STEP, MAX_STEP),
                    total=_opt_int(d.get("total"), f"{where}.total", 0, MAX_STEP),
                    step_time_s=_opt_num(d.get("step_time_s"), f"{where}.step_time_s"),
                    source=source, run_id=h.run_id, loss=loss)


def _stage(h: _Head, d: Mapping[str, Any], where: str, source: str, opens: Any) -> Stage:
    return Stage(h.job, h.attempt, h.node, h.ts,
                 _opt_int(d.get("rank"), f"{where}.rank", 0, MAX_RANK),
                 safe_name(_get(d, "stage", where), f"{where}.stage"),
                 _bool(opens, f"{where}.opens"),
                 _opt_num(d.get("hang_window_s"), f"{where}.hang_window_s", 1e-3, MAX_TS),
                 source=source, run_id=h.run_id,
                 step=_opt_int(d.get("step"), f"{where}.step", -MAX_STEP, MAX_STEP))


def note_signal(n: Notice) -> Progress | Stage | None:
    """The Progress or Stage signal an SDK `progress`/`stage` note stands for, else None."""
    h = _Head(n.job, n.attempt, n.node, n.ts, n.run_id)
    if n.kind == "progress":
        return _progress(h, n.data, "progress note", "sdk")
    if n.kind == "stage":
        return _stage(h, n.data, "stage note", "sdk", n.data.get("opens", True))
    return None
