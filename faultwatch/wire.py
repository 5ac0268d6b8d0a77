"""Wire contracts: orjson records on the logs, signals and decisions topics, versioned."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict
from typing import Any, overload

import orjson

from faultwatch.core.events import (
    Decision,
    Exit,
    Heartbeat,
    Hit,
    Line,
    Match,
    Notice,
    Output,
    Progress,
    RunStart,
    Signal,
    Stage,
    TailLine,
)
from faultwatch.errors import DecodeError

SCHEMA_VERSION = 1
_STREAM_CODE = {"stdout": "o", "stderr": "e"}
_CODE_STREAM = {"o": "stdout", "e": "stderr"}


def log_key(job: str, node: str) -> bytes:
    """Logs are keyed by job and node so a node's lines and lifecycle stay in order."""
    return f"{job}/{node}".encode()


def job_key(job: str) -> bytes:
    """Signals and decisions are keyed by job so one processor sees a whole job."""
    return job.encode()


# ---- logs topic (agent -> matcher) -------------------------------------------------------

def encode_run_start(ev: RunStart) -> bytes:
    d = asdict(ev)
    d["local_ranks"] = list(ev.local_ranks)
    d["cmd"] = list(ev.cmd)
    return orjson.dumps({"v": SCHEMA_VERSION, "t": "start", **d})


def encode_lines(job: str, attempt: int, node: str, run_id: str, lines: list[Line],
                 rank: int | None = None) -> bytes:
    """A batch of lines; `rank` is set in rank mode (one agent per rank), else None."""
    rows = [[_STREAM_CODE.get(ln.stream, ln.stream), ln.seq, ln.ts, ln.text, ln.flags, ln.orig_len]
            for ln in lines]
    d: dict[str, Any] = {"v": SCHEMA_VERSION, "t": "lines", "job": job, "attempt": attempt,
                         "node": node, "run_id": run_id, "lines": rows}
    if rank is not None:
        d["rank"] = rank
    return orjson.dumps(d)


def encode_heartbeat(ev: Heartbeat, run_id: str = "", stats: dict[str, Any] | None = None) -> bytes:
    return orjson.dumps({"v": SCHEMA_VERSION, "t": "hb", **asdict(ev), "run_id": run_id,
                         "stats": stats or {}})


def encode_exit(ev: Exit, run_id: str = "") -> bytes:
    return orjson.dumps({"v": SCHEMA_VERSION, "t": "exit", **asdict(ev), "run_id": run_id})


def encode_notice(job: str, attempt: int, node: str, ts: float, kind: str,
                  data: dict[str, Any]) -> bytes:
    """Agent-side notices (gaps, SDK messages, boot checks) travel as `note` records."""
    return orjson.dumps({"v": SCHEMA_VERSION, "t": "note", "job": job, "attempt": attempt,
                         "node": node, "ts": ts, "kind": kind, "data": data})


def _load_object(value: bytes | None) -> dict[str, Any]:
    if value is None:
        raise DecodeError("empty record")
    try:
        d = orjson.loads(value)
    except orjson.JSONDecodeError as e:
        raise DecodeError(f"not JSON: {e}") from None
    if not isinstance(d, dict):
        raise DecodeError("record is not a JSON object")
    return d


def decode(value: bytes | None) -> dict[str, Any]:
    """Decode any faultwatch record into a dict, or raise DecodeError saying why."""
    d = _load_object(value)
    v = d.get("v")
    if v != SCHEMA_VERSION:
        raise DecodeError(f"unsupported schema version {v!r} (expected {SCHEMA_VERSION})")
    if "t" not in d:
        raise DecodeError("record has no type field 't'")
    return d


def decode_decision(value: bytes | None) -> dict[str, Any]:
    """Decode a decisions-topic record (versioned; identified by its `id`, no type field)."""
    d = _load_object(value)
    if d.get("v") != SCHEMA_VERSION or "id" not in d:
        raise DecodeError("not a faultwatch decision (schema v1 with an id)")
    return d


def _row_line(r: Any) -> Line:
    try:
        ln = Line(_CODE_STREAM.get(r[0], r[0]), *r[1:6])
    except TypeError as e:
        raise DecodeError(f"malformed line row: {e}") from None
    if type(ln.seq) is not int or type(ln.text) is not str \
            or type(ln.ts) not in (float, int) or type(ln.flags) is not int:
        raise DecodeError(f"malformed line row (seq {ln.seq!r}): wrong field types")
    return ln


class LineRows(Sequence[Line]):
    """The lines of a decoded record as a lazy sequence: `texts` is extracted at once, a
    Line object is built (and type-checked) only when indexed. The matcher reads every
    text but only a few lines' times, so this saves building a Line per shipped line."""

    __slots__ = ("_rows", "texts")

    def __init__(self, rows: list[Any]) -> None:
        try:
            self.texts: list[str] = [r[3] for r in rows]
        except (IndexError, TypeError, KeyError) as e:
            raise DecodeError(f"malformed lines record: {e!r}") from None
        self._rows = rows

    def __len__(self) -> int:
        return len(self._rows)

    @overload
    def __getitem__(self, i: int) -> Line: ...

    @overload
    def __getitem__(self, i: slice) -> list[Line]: ...

    def __getitem__(self, i: int | slice) -> Line | list[Line]:
        if isinstance(i, slice):
            return [_row_line(r) for r in self._rows[i]]
        return _row_line(self._rows[i])


def line_rows(d: dict[str, Any]) -> LineRows:
    """The lines of a decoded `lines` record, lazily (see LineRows)."""
    rows = d.get("lines")
    if not isinstance(rows, list):
        raise DecodeError("malformed lines record: 'lines' is not a list")
    return LineRows(rows)


def lines_of(d: dict[str, Any]) -> list[Line]:
    """The Line objects of a decoded `lines` record, every row type-checked."""
    rows = d.get("lines")
    if not isinstance(rows, list):
        raise DecodeError("malformed lines record: 'lines' is not a list")
    return [_row_line(r) for r in rows]


def run_start_of(d: dict[str, Any]) -> RunStart:
    try:
        return RunStart(job=str(d["job"]), attempt=int(d["attempt"]), node=str(d["node"]),
                        ts=float(d["ts"]), run_id=str(d.get("run_id", "")),
                        world_size=_opt_int(d.get("world_size"), "world_size"),
                        nnodes=_opt_int(d.get("nnodes"), "nnodes"),
                        rank=_opt_int(d.get("rank"), "rank"),
                        local_ranks=tuple(int(r) for r in d.get("local_ranks") or ()),
                        host=str(d.get("host", "")), pid=int(d.get("pid", 0)),
                        cmd=tuple(d.get("cmd") or ()),
                        agent_version=str(d.get("agent_version", "")))
    except (KeyError, TypeError, ValueError) as e:
        raise DecodeError(f"malformed start record: {e!r}") from None


def heartbeat_of(d: dict[str, Any]) -> Heartbeat:
    try:
        return Heartbeat(job=str(d["job"]), attempt=int(d["attempt"]), node=str(d["node"]),
                         ts=float(d["ts"]), alive=bool(d["alive"]),
                         last_output_ts=_opt_float(d.get("last_output_ts"), "last_output_ts"),
                         started_ts=_opt_float(d.get("started_ts"), "started_ts"))
    except (KeyError, TypeError, ValueError) as e:
        raise DecodeError(f"malformed heartbeat record: {e!r}") from None


def exit_of(d: dict[str, Any]) -> Exit:
    try:
        return Exit(job=str(d["job"]), attempt=int(d["attempt"]), node=str(d["node"]),
                    ts=float(d["ts"]), exit_code=int(d["exit_code"]),
                    signal=_opt_int(d.get("signal"), "signal"))
    except (KeyError, TypeError, ValueError) as e:
        raise DecodeError(f"malformed exit record: {e!r}") from None


# ---- signals topic (matcher -> job processor) ---------------------------------------------

_MATCH_FIELDS = ("rule", "category", "cascade", "ts", "line", "rank", "stream", "seq", "action",
                 "context")


def signal_dict(sig: Signal) -> dict[str, Any]:
    """A signal as a plain dict (without the schema version): one element of a bundle, or,
    with `v` added, a signals-topic record of its own (encode_signal)."""
    if isinstance(sig, Output):
        return {"t": "out", "job": sig.job, "attempt": sig.attempt, "node": sig.node,
                "ts": sig.ts, "count": sig.count, "ranks": sig.rank_last_ts,
                "tail": [(t.rank, t.ts, t.text) for t in sig.tail]}
    if isinstance(sig, Heartbeat):
        return {"t": "hb", "job": sig.job, "attempt": sig.attempt, "node": sig.node,
                "ts": sig.ts, "alive": sig.alive, "last_output_ts": sig.last_output_ts,
                "started_ts": sig.started_ts, "run_id": "", "stats": {}}
    if isinstance(sig, Hit):
        m = sig.match
        return {"t": "hit", "job": sig.job, "attempt": sig.attempt, "node": sig.node,
                "m": {f: getattr(m, f) for f in _MATCH_FIELDS}}
    if isinstance(sig, Exit):
        return {"t": "exit", "job": sig.job, "attempt": sig.attempt, "node": sig.node,
                "ts": sig.ts, "exit_code": sig.exit_code, "signal": sig.signal, "run_id": ""}
    if isinstance(sig, RunStart):
        d = asdict(sig)
        d["local_ranks"] = list(sig.local_ranks)
        d["cmd"] = list(sig.cmd)
        return {"t": "start", **d}
    if isinstance(sig, Progress):
        d = {"t": "prog", "job": sig.job, "attempt": sig.attempt,
             "node": sig.node, "ts": sig.ts, "rank": sig.rank, "step": sig.step,
             "src": sig.source}
        if sig.total is not None:
            d["total"] = sig.total
        if sig.step_time_s is not None:
            d["step_time_s"] = sig.step_time_s
        return d
    if isinstance(sig, Stage):
        return {"t": "stage", "job": sig.job, "attempt": sig.attempt, "node": sig.node,
                "ts": sig.ts, "rank": sig.rank, "stage": sig.stage, "opens": sig.opens,
                "hang_window_s": sig.hang_window_s, "src": sig.source}
    if isinstance(sig, Notice):
        return {"t": "note", "job": sig.job, "attempt": sig.attempt, "node": sig.node,
                "ts": sig.ts, "kind": sig.kind, "data": dict(sig.data)}
    raise TypeError(f"not a signal: {sig!r}")


def encode_signal(sig: Signal) -> bytes:
    """One signal as a signals-topic record."""
    return orjson.dumps({"v": SCHEMA_VERSION, **signal_dict(sig)})


def encode_bundle(job: str, sigs: Sequence[Signal | dict[str, Any]]) -> bytes:
    """Several signals of one job, in order, as ONE signals-topic record (`t: bundle`).
    The matcher sends one per job per batch instead of one record per signal; consumers
    unpack it with signals_of_record. Elements may be signals or signal_dict()s."""
    return orjson.dumps({"v": SCHEMA_VERSION, "t": "bundle", "job": job,
                         "sigs": [s if isinstance(s, dict) else signal_dict(s) for s in sigs]})


def signals_of_record(d: dict[str, Any]) -> list[Signal]:
    """The signals of a decoded signals-topic record: a bundle's, or the single one."""
    if d["t"] != "bundle":
        return [signal_of(d)]
    sigs = d.get("sigs")
    if not isinstance(sigs, list):
        raise DecodeError("malformed bundle: 'sigs' is not a list")
    out = []
    for x in sigs:
        if not isinstance(x, dict) or "t" not in x:
            raise DecodeError("malformed bundle element")
        out.append(signal_of(x))
    return out


def _opt_int(x: Any, name: str = "value") -> int | None:
    """An optional integer field; junk raises ValueError naming the field (-> DecodeError)."""
    if x is None:
        return None
    try:
        return int(x)
    except (TypeError, ValueError):
        raise ValueError(f"{name} must be an integer or null, got {x!r}") from None


def _opt_float(x: Any, name: str = "value") -> float | None:
    """An optional number field; junk raises ValueError naming the field (-> DecodeError)."""
    if x is None:
        return None
    try:
        return float(x)
    except (TypeError, ValueError):
        raise ValueError(f"{name} must be a number or null, got {x!r}") from None


def notice_of(d: dict[str, Any]) -> Notice:
    try:
        data = d.get("data") or {}
        if not isinstance(data, dict):
            raise TypeError("note data is not an object")
        return Notice(job=str(d["job"]), attempt=int(d["attempt"]), node=str(d["node"]),
                      ts=float(d["ts"]), kind=str(d["kind"]), data=data)
    except (KeyError, TypeError, ValueError) as e:
        raise DecodeError(f"malformed note record: {e!r}") from None


def note_signal(n: Notice) -> Progress | Stage | None:
    """The Progress or Stage signal an SDK `progress`/`stage` note stands for, else None."""
    d: dict[str, Any] = dict(n.data)
    try:
        if n.kind == "progress":
            return Progress(n.job, n.attempt, n.node, n.ts, _opt_int(d.get("rank"), "rank"),
                            int(d["step"]), total=_opt_int(d.get("total"), "total"),
                            step_time_s=_opt_float(d.get("step_time_s"), "step_time_s"),
                            source="sdk")
        if n.kind == "stage":
            return Stage(n.job, n.attempt, n.node, n.ts, _opt_int(d.get("rank"), "rank"),
                         str(d["stage"]), bool(d.get("opens", True)),
                         _opt_float(d.get("hang_window_s"), "hang_window_s"), source="sdk")
    except (KeyError, TypeError, ValueError) as e:
        raise DecodeError(f"malformed {n.kind} note: {e!r}") from None
    return None


def signal_of(d: dict[str, Any]) -> Signal:
    """The Signal object of a decoded signals-topic record."""
    t = d["t"]
    if t == "start":
        return run_start_of(d)
    if t == "hb":
        return heartbeat_of(d)
    if t == "exit":
        return exit_of(d)
    if t == "note":
        return notice_of(d)
    try:
        if t == "prog":
            return Progress(job=str(d["job"]), attempt=int(d["attempt"]), node=str(d["node"]),
                            ts=float(d["ts"]), rank=_opt_int(d.get("rank"), "rank"),
                            step=int(d["step"]),
                            total=_opt_int(d.get("total"), "total"),
                            step_time_s=_opt_float(d.get("step_time_s"), "step_time_s"),
                            source=str(d.get("src", "log")))
        if t == "stage":
            return Stage(job=str(d["job"]), attempt=int(d["attempt"]), node=str(d["node"]),
                         ts=float(d["ts"]), rank=_opt_int(d.get("rank"), "rank"),
                         stage=str(d["stage"]), opens=bool(d["opens"]),
                         hang_window_s=_opt_float(d.get("hang_window_s"), "hang_window_s"),
                         source=str(d.get("src", "log")))
        if t == "hit":
            m = dict(d["m"])
            m["context"] = tuple(m.get("context") or ())
            return Hit(job=d["job"], attempt=int(d["attempt"]), node=d["node"], match=Match(**m))
        if t == "out":
            return Output(job=d["job"], attempt=int(d["attempt"]), node=d["node"],
                          ts=float(d["ts"]), count=int(d["count"]),
                          rank_last_ts=tuple((r, float(ts)) for r, ts in d["ranks"]),
                          tail=tuple(TailLine(r, float(ts), txt) for r, ts, txt in d["tail"]))
    except (KeyError, TypeError, ValueError) as e:
        raise DecodeError(f"malformed {t} signal: {e!r}") from None
    raise DecodeError(f"unknown signal type {t!r}")


# ---- decisions topic ------------------------------------------------------------------

def decision_to_dict(dec: Decision) -> dict[str, Any]:
    """The published JSON shape of a decision (see faultwatch/schemas/decision.schema.json)."""
    return {
        "v": SCHEMA_VERSION,
        "id": dec.id,
        "job": dec.job,
        "attempt": dec.attempt,
        "action": dec.action,
        "targets": {"nodes": list(dec.nodes), "ranks": list(dec.ranks)},
        "reason": {"kind": dec.kind, "rule": dec.rule, "category": dec.category,
                   "message": dec.message},
        "evidence": dec.evidence,
        "budgets": dec.budgets,
        "rules_version": dec.rules_version,
        "ts": dec.ts,
    }


def encode_decision(dec: Decision) -> bytes:
    return orjson.dumps(decision_to_dict(dec))


def decision_of(d: dict[str, Any]) -> Decision:
    try:
        return Decision(id=d["id"], job=d["job"], attempt=int(d["attempt"]), action=d["action"],
                        kind=d["reason"]["kind"], ts=float(d["ts"]),
                        nodes=tuple(d["targets"]["nodes"]), ranks=tuple(d["targets"]["ranks"]),
                        rule=d["reason"].get("rule"), category=d["reason"].get("category"),
                        message=d["reason"].get("message", ""), evidence=d.get("evidence", {}),
                        budgets=d.get("budgets", {}), rules_version=d.get("rules_version", ""))
    except (KeyError, TypeError, ValueError) as e:
        raise DecodeError(f"malformed decision: {e!r}") from None
