"""Wire contracts: orjson records on the logs, signals and decisions topics, versioned."""

from __future__ import annotations

from dataclasses import asdict
from typing import Any

import orjson

from faultwatch.core.events import (
    Decision,
    Exit,
    Heartbeat,
    Hit,
    Line,
    Match,
    Output,
    RunStart,
    Signal,
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


def decode(value: bytes | None) -> dict[str, Any]:
    """Decode any faultwatch record into a dict, or raise DecodeError saying why."""
    if value is None:
        raise DecodeError("empty record")
    try:
        d = orjson.loads(value)
    except orjson.JSONDecodeError as e:
        raise DecodeError(f"not JSON: {e}") from None
    if not isinstance(d, dict):
        raise DecodeError("record is not a JSON object")
    v = d.get("v")
    if v != SCHEMA_VERSION:
        raise DecodeError(f"unsupported schema version {v!r} (expected {SCHEMA_VERSION})")
    if "t" not in d:
        raise DecodeError("record has no type field 't'")
    return d


def decode_decision(value: bytes | None) -> dict[str, Any]:
    """Decode a decisions-topic record (versioned; identified by its `id`, no type field)."""
    if value is None:
        raise DecodeError("empty record")
    try:
        d = orjson.loads(value)
    except orjson.JSONDecodeError as e:
        raise DecodeError(f"not JSON: {e}") from None
    if not isinstance(d, dict) or d.get("v") != SCHEMA_VERSION or "id" not in d:
        raise DecodeError("not a faultwatch decision (schema v1 with an id)")
    return d


def lines_of(d: dict[str, Any]) -> list[Line]:
    """The Line objects of a decoded `lines` record."""
    try:
        return [Line(stream=_CODE_STREAM.get(r[0], r[0]), seq=int(r[1]), ts=float(r[2]),
                     text=str(r[3]), flags=int(r[4]) if len(r) > 4 else 0,
                     orig_len=int(r[5]) if len(r) > 5 else 0) for r in d["lines"]]
    except (KeyError, IndexError, TypeError, ValueError) as e:
        raise DecodeError(f"malformed lines record: {e!r}") from None


def run_start_of(d: dict[str, Any]) -> RunStart:
    try:
        return RunStart(job=str(d["job"]), attempt=int(d["attempt"]), node=str(d["node"]),
                        ts=float(d["ts"]), run_id=str(d.get("run_id", "")),
                        world_size=d.get("world_size"), nnodes=d.get("nnodes"),
                        rank=d.get("rank"), local_ranks=tuple(d.get("local_ranks") or ()),
                        host=str(d.get("host", "")), pid=int(d.get("pid", 0)),
                        cmd=tuple(d.get("cmd") or ()),
                        agent_version=str(d.get("agent_version", "")))
    except (KeyError, TypeError, ValueError) as e:
        raise DecodeError(f"malformed start record: {e!r}") from None


def heartbeat_of(d: dict[str, Any]) -> Heartbeat:
    try:
        return Heartbeat(job=str(d["job"]), attempt=int(d["attempt"]), node=str(d["node"]),
                         ts=float(d["ts"]), alive=bool(d["alive"]),
                         last_output_ts=d.get("last_output_ts"), started_ts=d.get("started_ts"))
    except (KeyError, TypeError, ValueError) as e:
        raise DecodeError(f"malformed heartbeat record: {e!r}") from None


def exit_of(d: dict[str, Any]) -> Exit:
    try:
        return Exit(job=str(d["job"]), attempt=int(d["attempt"]), node=str(d["node"]),
                    ts=float(d["ts"]), exit_code=int(d["exit_code"]), signal=d.get("signal"))
    except (KeyError, TypeError, ValueError) as e:
        raise DecodeError(f"malformed exit record: {e!r}") from None


# ---- signals topic (matcher -> job processor) ---------------------------------------------

def encode_signal(sig: Signal) -> bytes:
    if isinstance(sig, RunStart):
        return encode_run_start(sig)
    if isinstance(sig, Heartbeat):
        return encode_heartbeat(sig)
    if isinstance(sig, Exit):
        return encode_exit(sig)
    if isinstance(sig, Hit):
        return orjson.dumps({"v": SCHEMA_VERSION, "t": "hit", "job": sig.job,
                             "attempt": sig.attempt, "node": sig.node, "m": asdict(sig.match)})
    if isinstance(sig, Output):
        return orjson.dumps({"v": SCHEMA_VERSION, "t": "out", "job": sig.job,
                             "attempt": sig.attempt, "node": sig.node, "ts": sig.ts,
                             "count": sig.count, "ranks": [list(x) for x in sig.rank_last_ts],
                             "tail": [[t.rank, t.ts, t.text] for t in sig.tail]})
    raise TypeError(f"not a signal: {sig!r}")


def signal_of(d: dict[str, Any]) -> Signal:
    """The Signal object of a decoded signals-topic record."""
    t = d["t"]
    if t == "start":
        return run_start_of(d)
    if t == "hb":
        return heartbeat_of(d)
    if t == "exit":
        return exit_of(d)
    try:
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
