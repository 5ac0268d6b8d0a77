"""Wire contracts: orjson records on the logs, signals and decisions topics, validated once."""

from __future__ import annotations

import bisect
import math
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any, Protocol, overload

import orjson

from faultwatch.core.events import (
    ACTIONS,
    Decision,
    Exit,
    Heartbeat,
    Hit,
    Line,
    Match,
    Notice,
    Output,
    Progress,
    ProgressBatch,
    RankStep,
    RunStart,
    Signal,
    Stage,
    TailLine,
)
from faultwatch.errors import DecodeError
from faultwatch.nodes.registry import MAX_REASONS, NodeRecord
from faultwatch.nodes.registry import STATES as NODE_STATES
from faultwatch.nodes.registry import Reason as NodeReason

SCHEMA_VERSION = 1
_STREAM_CODE = {"stdout": "o", "stderr": "e"}
_CODE_STREAM = {"o": "stdout", "e": "stderr"}

# ---- bounds every decoded record is held to (a record outside them is a DecodeError) -----
MAX_ID_CHARS = 256  # job, node, run and decision ids, rule ids, stage names, note kinds
MAX_ATTEMPT = 10_000
MAX_RANK = 10_000_000  # ranks and world sizes
MAX_STEP = 2**62
MAX_TS = 1e11  # seconds since the epoch (year 5138): larger is junk, not a time
MIN_EXIT_CODE, MAX_EXIT_CODE = -255, 255
MAX_SIGNAL = 128
MAX_LINES = 100_000  # lines per logs record (agents send at most a few hundred)
MAX_TEXT_CHARS = 1 << 20  # one line, message or matched line
MAX_CONTEXT = 1_000  # traceback lines of a match
MAX_TAIL = 256  # tail lines of an output signal
MAX_SIGS = 100_000  # signals per bundle
MAX_ITEMS = 10_000  # other lists: targets, local ranks, command words
MAX_JSON_DEPTH = 8  # free-form objects: note data, scheduler, evidence, budgets
MAX_JSON_ITEMS = 10_000


def log_key(job: str, node: str) -> bytes:
    """Logs are keyed by job and node so a node's lines and lifecycle stay in order."""
    return f"{job}/{node}".encode()


def job_key(job: str) -> bytes:
    """Signals and decisions are keyed by job so one processor sees a whole job."""
    return job.encode()


# ---- validation primitives: each names the field it rejects ------------------------------

def _bad(field: str, why: str, x: Any) -> DecodeError:
    shown = repr(x)
    return DecodeError(f"{field}: {why}, got {shown[:80]}{'...' if len(shown) > 80 else ''}")


_CONTROL = re.compile("[\x00-\x1f\x7f-\x9f]")  # C0, DEL and C1


def _has_control(s: str) -> bool:
    return _CONTROL.search(s) is not None  # one C scan (a per-char genexpr cost 10% of a stage)


def safe_name(x: Any, field: str, *, empty_ok: bool = False) -> str:
    """A name that may become a key, a path part or terminal output: a string of at most
    MAX_ID_CHARS characters without control characters (and not empty unless allowed)."""
    if type(x) is not str:
        raise _bad(field, "must be a string", x)
    if not x and not empty_ok:
        raise _bad(field, "must not be empty", x)
    if len(x) > MAX_ID_CHARS:
        raise _bad(field, f"longer than {MAX_ID_CHARS} characters", x)
    if _has_control(x):
        raise _bad(field, "contains a control character", x)
    return x


def _text(x: Any, field: str, max_chars: int = MAX_TEXT_CHARS) -> str:
    if type(x) is not str:
        raise _bad(field, "must be a string", x)
    if len(x) > max_chars:
        raise _bad(field, f"longer than {max_chars} characters", x[:40])
    return x


def _int(x: Any, field: str, lo: int, hi: int) -> int:
    if type(x) is not int:  # bool is not an int here; neither is 1.0 or "1"
        raise _bad(field, "must be an integer", x)
    if not lo <= x <= hi:
        raise _bad(field, f"out of range [{lo}, {hi}]", x)
    return x


def _opt_int(x: Any, field: str, lo: int, hi: int) -> int | None:
    return None if x is None else _int(x, field, lo, hi)


def _num(x: Any, field: str, lo: float = 0.0, hi: float = MAX_TS) -> float:
    if type(x) is not float and type(x) is not int:
        raise _bad(field, "must be a number", x)
    f = float(x)
    if not math.isfinite(f):
        raise _bad(field, "must be finite", x)
    if not lo <= f <= hi:
        raise _bad(field, f"out of range [{lo:g}, {hi:g}]", x)
    return f


def _opt_num(x: Any, field: str, lo: float = 0.0, hi: float = MAX_TS) -> float | None:
    return None if x is None else _num(x, field, lo, hi)


def _bool(x: Any, field: str) -> bool:
    if type(x) is not bool:
        raise _bad(field, "must be true or false", x)
    return x


def _list(x: Any, field: str, max_items: int = MAX_ITEMS) -> list[Any]:
    if type(x) is not list:
        raise _bad(field, "must be a list", x)
    if len(x) > max_items:
        raise _bad(field, f"more than {max_items} items", len(x))
    return x


def _obj(x: Any, field: str) -> dict[str, Any]:
    if type(x) is not dict:
        raise _bad(field, "must be an object", x)
    return x


def _json(x: Any, field: str) -> Any:
    """A free-form value (note data, evidence): JSON with finite numbers, bounded depth and
    item count. Returned as is."""
    budget = [MAX_JSON_ITEMS]

    def walk(v: Any, depth: int) -> None:
        budget[0] -= 1
        if budget[0] < 0:
            raise _bad(field, f"more than {MAX_JSON_ITEMS} values", "...")
        if depth > MAX_JSON_DEPTH:
            raise _bad(field, f"nested deeper than {MAX_JSON_DEPTH}", "...")
        if type(v) is float and not math.isfinite(v):
            raise _bad(field, "numbers must be finite", v)
        if type(v) is str and len(v) > MAX_TEXT_CHARS:
            raise _bad(field, f"a string longer than {MAX_TEXT_CHARS} characters", v[:40])
        if type(v) is dict:
            for y in v.values():
                walk(y, depth + 1)
        elif type(v) is list:
            for y in v:
                walk(y, depth + 1)

    walk(x, 0)
    return x


def _json_obj(x: Any, field: str) -> dict[str, Any]:
    result: dict[str, Any] = _json(_obj(x, field), field)
    return result


def _get(d: Mapping[str, Any], key: str, where: str) -> Any:
    try:
        return d[key]
    except KeyError:
        raise DecodeError(f"{where}: missing field {key!r}") from None


@dataclass(frozen=True, slots=True)
class _Head:
    """The fields every job record starts with."""

    job: str
    attempt: int
    node: str
    ts: float
    run_id: str


def _head(d: Mapping[str, Any], where: str, *, ts: bool = True) -> _Head:
    return _Head(job=safe_name(_get(d, "job", where), f"{where}.job"),
                 attempt=_int(_get(d, "attempt", where), f"{where}.attempt", 0, MAX_ATTEMPT),
                 node=safe_name(_get(d, "node", where), f"{where}.node"),
                 ts=_num(_get(d, "ts", where), f"{where}.ts") if ts else 0.0,
                 run_id=safe_name(d.get("run_id", ""), f"{where}.run_id", empty_ok=True))


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
    """Decode any faultwatch record into a dict (version and type checked, fields not yet);
    the typed decoders below validate the fields."""
    d = _load_object(value)
    v = d.get("v")
    if v != SCHEMA_VERSION:
        raise DecodeError(f"unsupported schema version {v!r} (expected {SCHEMA_VERSION})")
    if type(d.get("t")) is not str:
        raise DecodeError("record has no type field 't'")
    return d


# ---- lines ---------------------------------------------------------------------------------

def _row_line(r: Any) -> Line:
    if type(r) is not list or not 4 <= len(r) <= 6:
        raise _bad("line row", "must be [stream, seq, ts, text, flags, orig_len]", r)
    code, seq, ts, text, flags, orig_len = (r + [0, 0])[:6]
    if type(code) is not str or len(code) > 16:
        raise _bad("line row stream", "must be a short string", code)
    stream = _CODE_STREAM.get(code, code)
    return Line(stream, _int(seq, "line row seq", -1, 2**63 - 1), _num(ts, "line row ts"),
                _text(text, "line row text"), _int(flags, "line row flags", 0, 2**16),
                _int(orig_len, "line row orig_len", 0, 2**62))


_TEXT_TYPES = frozenset({str})


class LineRows(Sequence[Line]):
    """The lines of a decoded record as a lazy sequence. Every text's type and every time's
    finiteness are checked at once (what the matcher reads; text sizes are bounded by the
    record's); a Line object is built, and fully checked, only when indexed: the matcher
    reads every text but only a few lines' other fields. An indexed Line is kept: the
    matcher stage reads the same few lines (the tail, each rank's last line, progress
    lines) several times."""

    __slots__ = ("_lines", "_rows", "texts")

    _rows: Sequence[Any]
    _lines: dict[int, Line]  # by the index as it was given (-1 and n-1 are two entries)

    def __init__(self, rows: list[Any]) -> None:
        try:
            texts: list[str] = [r[3] for r in rows]
            finite = all(map(math.isfinite, [r[2] for r in rows]))  # TypeError if not numbers
        except (IndexError, TypeError, KeyError) as e:
            raise DecodeError(f"malformed lines record: {e!r}") from None
        if not finite:
            raise DecodeError("malformed lines record: a line time is not finite")
        if not _TEXT_TYPES.issuperset(map(type, texts)):
            raise DecodeError("malformed lines record: a line text is not a string")
        self.texts = texts
        self._rows = rows
        self._lines = {}

    def __len__(self) -> int:
        return len(self._rows)

    @overload
    def __getitem__(self, i: int) -> Line: ...

    @overload
    def __getitem__(self, i: slice) -> list[Line]: ...

    def __getitem__(self, i: int | slice) -> Line | list[Line]:
        if isinstance(i, slice):
            return [_row_line(r) for r in self._rows[i]]
        ln = self._lines.get(i)
        if ln is None:
            ln = self._lines[i] = _row_line(self._rows[i])
        return ln

    @classmethod
    def of_chunks(cls, chunks: list[Any]) -> LineRows:
        """The lines of a chunked record (see encode_line_chunks), each chunk checked."""
        self = cls.__new__(cls)
        rows = _ChunkRows(chunks)
        self.texts, self._rows, self._lines = rows.texts, rows, {}
        return self


class _ChunkRows(Sequence[list[Any]]):
    """The rows of a chunked `lines` record, built on demand: chunk j holds the lines
    starts[j] .. starts[j+1]-1, its text split at "\n"."""

    __slots__ = ("_chunks", "_starts", "texts")

    def __init__(self, chunks: list[Any]) -> None:
        texts: list[str] = []
        starts: list[int] = []
        for c in chunks:
            if type(c) is not list or len(c) != 6:
                raise _bad("line chunk", "must be [stream, seq0, ts, text, flags, orig_len]", c)
            code, seq, ts, text, flags, orig_len = c
            if type(code) is not str or len(code) > 16:
                raise _bad("line chunk stream", "must be a short string", code)
            _int(seq, "line chunk seq0", -1, 2**63 - 1)
            _num(ts, "line chunk ts")
            _text(text, "line chunk text")
            _int(flags, "line chunk flags", 0, 2**16)
            _int(orig_len, "line chunk orig_len", 0, 2**62)
            starts.append(len(texts))
            if "\n" in text:
                if flags or orig_len:
                    raise _bad("line chunk", "flags or orig_len on a chunk of several lines", c)
                texts += text.split("\n")
            else:
                texts.append(text)
            if len(texts) > MAX_LINES:
                raise _bad("lines.chunks", f"more than {MAX_LINES} lines", len(texts))
        self._chunks, self._starts, self.texts = chunks, starts, texts

    def __len__(self) -> int:
        return len(self.texts)

    def _row(self, i: int) -> list[Any]:
        if i < 0:
            i += len(self.texts)
        if not 0 <= i < len(self.texts):
            raise IndexError(i)
        j = bisect.bisect_right(self._starts, i) - 1
        code, seq, ts, _, flags, orig_len = self._chunks[j]
        k = i - self._starts[j]
        return [code, seq + k, ts, self.texts[i], flags, orig_len]

    @overload
    def __getitem__(self, i: int) -> list[Any]: ...

    @overload
    def __getitem__(self, i: slice) -> list[list[Any]]: ...

    def __getitem__(self, i: int | slice) -> list[Any] | list[list[Any]]:
        if isinstance(i, slice):
            return [self._row(k) for k in range(*i.indices(len(self.texts)))]
        return self._row(i)


@dataclass(frozen=True, slots=True)
class LinesBatch:
    """A decoded `lines` record: a batch of one node's lines (rank set in rank mode)."""

    job: str
    attempt: int
    node: str
    run_id: str
    rank: int | None
    lines: LineRows


def encode_lines(job: str, attempt: int, node: str, run_id: str, lines: list[Line],
                 rank: int | None = None) -> bytes:
    """A batch of lines; `rank` is set in rank mode (one agent per rank), else None."""
    return _encode_line_rows(job, attempt, node, run_id, "lines", lines, rank)


def _encode_line_rows(job: str, attempt: int, node: str, run_id: str, field: str,
                      items: Sequence[LineChunk], rank: int | None) -> bytes:
    """A lines record whose `field` ("lines" or "chunks") holds one row per item."""
    rows = [[_STREAM_CODE.get(c.stream, c.stream), c.seq, c.ts, c.text, c.flags, c.orig_len]
            for c in items]
    d: dict[str, Any] = {"v": SCHEMA_VERSION, "t": "lines", "job": job, "attempt": attempt,
                         "node": node, "run_id": run_id, field: rows}
    if rank is not None:
        d["rank"] = rank
    return orjson.dumps(d)


class LineChunk(Protocol):
    """A Line, or consecutive lines of one stream and read joined by "\\n" (same fields)."""

    @property
    def stream(self) -> str: ...
    @property
    def seq(self) -> int: ...
    @property
    def ts(self) -> float: ...
    @property
    def text(self) -> str: ...
    @property
    def flags(self) -> int: ...
    @property
    def orig_len(self) -> int: ...


def encode_line_chunks(job: str, attempt: int, node: str, run_id: str,
                       chunks: Sequence[LineChunk], rank: int | None = None) -> bytes:
    """A batch of lines as chunks (the agent's form): each chunk is a Line whose text holds
    one or more consecutive lines of one stream and read, joined by "\n" (numbered from its
    seq, all with its ts); flags and orig_len only on a chunk of one line. No line text may
    hold "\n" itself (the agent's splitter never makes one)."""
    return _encode_line_rows(job, attempt, node, run_id, "chunks", chunks, rank)


def line_rows(d: Mapping[str, Any]) -> LineRows:
    """The lines of a decoded `lines` record (rows or chunks), lazily (see LineRows)."""
    if "chunks" in d:
        return LineRows.of_chunks(_list(d["chunks"], "lines.chunks", MAX_LINES))
    return LineRows(_list(_get(d, "lines", "lines"), "lines.lines", MAX_LINES))


def lines_batch_of(d: Mapping[str, Any]) -> LinesBatch:
    h = _head(d, "lines", ts=False)
    rows = line_rows(d)
    return LinesBatch(h.job, h.attempt, h.node, h.run_id,
                      _opt_int(d.get("rank"), "lines.rank", 0, MAX_RANK), rows)


def lines_of(d: Mapping[str, Any]) -> list[Line]:
    """The Line objects of a decoded `lines` record (rows or chunks), every row checked."""
    if "chunks" in d:
        return list(line_rows(d))
    return [_row_line(r) for r in _list(d.get("lines"), "lines.lines", MAX_LINES)]


# ---- lifecycle and notes (the same shape on the logs and the signals topic) -------------

def _scheduler(x: Any, where: str) -> dict[str, object]:
    d = _json_obj(x, f"{where}.scheduler")
    for k in d:
        safe_name(k, f"{where}.scheduler key")
    return d


def encode_run_start(ev: RunStart) -> bytes:
    return orjson.dumps({"v": SCHEMA_VERSION, **signal_dict(ev)})


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


def encode_heartbeat(ev: Heartbeat, run_id: str = "", stats: dict[str, Any] | None = None
                     ) -> bytes:
    return orjson.dumps({"v": SCHEMA_VERSION, **asdict(ev), "t": "hb",
                         "run_id": run_id or ev.run_id, "stats": stats or {}})


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
                signal=_opt_int(d.get("signal"), "exit.signal", 1, MAX_SIGNAL), run_id=h.run_id)


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


def _progress(h: _Head, d: Mapping[str, Any], where: str, source: str) -> Progress:
    return Progress(h.job, h.attempt, h.node, h.ts, _opt_int(d.get("rank"), f"{where}.rank", 0,
                                                             MAX_RANK),
                    _int(_get(d, "step", where), f"{where}.step", -MAX_STEP, MAX_STEP),
                    total=_opt_int(d.get("total"), f"{where}.total", 0, MAX_STEP),
                    step_time_s=_opt_num(d.get("step_time_s"), f"{where}.step_time_s"),
                    source=source, run_id=h.run_id)


def _stage(h: _Head, d: Mapping[str, Any], where: str, source: str, opens: Any) -> Stage:
    return Stage(h.job, h.attempt, h.node, h.ts,
                 _opt_int(d.get("rank"), f"{where}.rank", 0, MAX_RANK),
                 safe_name(_get(d, "stage", where), f"{where}.stage"),
                 _bool(opens, f"{where}.opens"),
                 _opt_num(d.get("hang_window_s"), f"{where}.hang_window_s", 1e-3, MAX_TS),
                 source=source, run_id=h.run_id)


def note_signal(n: Notice) -> Progress | Stage | None:
    """The Progress or Stage signal an SDK `progress`/`stage` note stands for, else None."""
    h = _Head(n.job, n.attempt, n.node, n.ts, n.run_id)
    if n.kind == "progress":
        return _progress(h, n.data, "progress note", "sdk")
    if n.kind == "stage":
        return _stage(h, n.data, "stage note", "sdk", n.data.get("opens", True))
    return None


LogsRecord = LinesBatch | RunStart | Heartbeat | Exit | Notice | Progress | Stage

_LOGS_DECODERS: dict[str, Callable[[Mapping[str, Any]], LogsRecord]] = {
    "lines": lines_batch_of, "start": run_start_of, "hb": heartbeat_of, "exit": exit_of,
}


def logs_record_of(d: Mapping[str, Any]) -> LogsRecord:
    """The typed record of a decoded logs-topic dict; SDK progress and stage notes come out
    as the Progress and Stage signals they stand for."""
    t = d.get("t")
    if t == "note":
        n = notice_of(d)
        return note_signal(n) or n
    dec = _LOGS_DECODERS.get(t) if type(t) is str else None
    if dec is None:
        raise _bad("record type", "unknown", t)
    return dec(d)


def decode_logs(value: bytes | None) -> LogsRecord:
    """One logs-topic record, validated: a LinesBatch, RunStart, Heartbeat, Exit, Notice,
    or the Progress/Stage of an SDK note. Raises DecodeError saying what is wrong."""
    return logs_record_of(decode(value))


# ---- signals topic (matcher -> job processor) ---------------------------------------------

_MATCH_FIELDS = ("rule", "category", "cascade", "ts", "line", "rank", "stream", "seq", "action",
                 "context")


def _with_run(d: dict[str, Any], run_id: str) -> dict[str, Any]:
    if run_id:
        d["run_id"] = run_id
    return d


def signal_dict(sig: Signal) -> dict[str, Any]:
    """A signal as a plain dict (without the schema version): one element of a bundle, or,
    with `v` added, a signals-topic record of its own (encode_signal)."""
    head = {"job": sig.job, "attempt": sig.attempt, "node": sig.node}
    if isinstance(sig, Output):
        return _with_run({"t": "out", **head, "ts": sig.ts, "count": sig.count,
                          "ranks": sig.rank_last_ts,
                          "tail": [(t.rank, t.ts, t.text) for t in sig.tail]}, sig.run_id)
    if isinstance(sig, Heartbeat):
        return {"t": "hb", **head, "ts": sig.ts, "alive": sig.alive,
                "last_output_ts": sig.last_output_ts, "started_ts": sig.started_ts,
                "run_id": sig.run_id, "stats": {}}
    if isinstance(sig, Hit):
        m = sig.match
        return _with_run({"t": "hit", **head, "m": {f: getattr(m, f) for f in _MATCH_FIELDS}},
                         sig.run_id)
    if isinstance(sig, Exit):
        return {"t": "exit", **head, "ts": sig.ts, "exit_code": sig.exit_code,
                "signal": sig.signal, "run_id": sig.run_id}
    if isinstance(sig, RunStart):
        d = asdict(sig)
        d["local_ranks"] = list(sig.local_ranks)
        d["cmd"] = list(sig.cmd)
        return {"t": "start", **d}
    if isinstance(sig, Progress):
        d = {"t": "prog", **head, "ts": sig.ts, "rank": sig.rank, "step": sig.step,
             "src": sig.source}
        if sig.total is not None:
            d["total"] = sig.total
        if sig.step_time_s is not None:
            d["step_time_s"] = sig.step_time_s
        return _with_run(d, sig.run_id)
    if isinstance(sig, ProgressBatch):
        return _with_run({"t": "progs", **head, "marks": [tuple(m) for m in sig.marks]},
                         sig.run_id)
    if isinstance(sig, Stage):
        return _with_run({"t": "stage", **head, "ts": sig.ts, "rank": sig.rank,
                          "stage": sig.stage, "opens": sig.opens,
                          "hang_window_s": sig.hang_window_s, "src": sig.source}, sig.run_id)
    if isinstance(sig, Notice):
        return _with_run({"t": "note", **head, "ts": sig.ts, "kind": sig.kind,
                          "data": dict(sig.data)}, sig.run_id)
    raise TypeError(f"not a signal: {sig!r}")


def encode_signal(sig: Signal) -> bytes:
    """One signal as a signals-topic record."""
    return orjson.dumps({"v": SCHEMA_VERSION, **signal_dict(sig)})


def encode_bundle(job: str, sigs: Sequence[Signal | dict[str, Any]]) -> bytes:
    """Several signals of one job, in order, as ONE signals-topic record (`t: bundle`).
    The matcher sends one per job per batch instead of one record per signal; consumers
    unpack it with decode_signals. Elements may be signals or signal_dict()s."""
    return orjson.dumps({"v": SCHEMA_VERSION, "t": "bundle", "job": job,
                         "sigs": [s if isinstance(s, dict) else signal_dict(s) for s in sigs]})


MAX_RECORD_BYTES = 900_000  # what faultwatch produces stays below the broker's 1 MB default
_CUT_CHARS = 2000  # a signal too large for a record keeps this much of each quoted line


def _cut_element(d: dict[str, Any]) -> dict[str, Any]:
    """A signal dict with its quoted lines cut (tails, match lines and tracebacks)."""
    if d.get("t") == "hit":
        m = d["m"]
        return {**d, "m": {**m, "line": m["line"][:_CUT_CHARS],
                           "context": [c[:_CUT_CHARS] for c in list(m["context"])[-40:]]}}
    if d.get("t") == "out":
        return {**d, "tail": [(r, ts, text[:_CUT_CHARS]) for r, ts, text in d["tail"]]}
    return d


def encode_bundles(job: str, sigs: Sequence[Signal | dict[str, Any]],
                   max_bytes: int = MAX_RECORD_BYTES) -> list[bytes]:
    """The signals of one job as bundles (encode_bundle) of at most max_bytes each, in
    order: a backlog's batch never makes a record the broker refuses. A signal too large
    on its own has its quoted lines cut; one still too large raises ValueError."""
    head = orjson.dumps({"v": SCHEMA_VERSION, "t": "bundle", "job": job})[:-1] + b',"sigs":['
    room = max_bytes - len(head) - 2
    out: list[bytes] = []
    chunk: list[bytes] = []
    size = 0
    for s in sigs:
        d = s if isinstance(s, dict) else signal_dict(s)
        e = orjson.dumps(d)
        if len(e) > room:
            e = orjson.dumps(_cut_element(d))
            if len(e) > room:
                raise ValueError(f"a {d.get('t')} signal of job {job!r} is {len(e)} bytes, "
                                 f"more than a record holds ({max_bytes})")
        if chunk and size + len(e) + 1 > room:
            out.append(head + b",".join(chunk) + b"]}")
            chunk, size = [], 0
        chunk.append(e)
        size += len(e) + 1
    if chunk:
        out.append(head + b",".join(chunk) + b"]}")
    return out


def match_of(m: Any, where: str = "hit.m") -> Match:
    """A rule match as the matcher sent it (the `m` of a hit signal)."""
    m = _obj(m, where)
    action = m.get("action")
    if action is not None and action not in ACTIONS:
        raise _bad(f"{where}.action", f"must be one of {ACTIONS} or null", action)
    return Match(rule=safe_name(_get(m, "rule", where), f"{where}.rule"),
                 category=safe_name(_get(m, "category", where), f"{where}.category"),
                 cascade=_bool(_get(m, "cascade", where), f"{where}.cascade"),
                 ts=_num(_get(m, "ts", where), f"{where}.ts"),
                 line=_text(_get(m, "line", where), f"{where}.line"),
                 rank=_opt_int(m.get("rank"), f"{where}.rank", 0, MAX_RANK),
                 stream=safe_name(m.get("stream", "stderr"), f"{where}.stream"),
                 seq=_int(m.get("seq", -1), f"{where}.seq", -1, 2**63 - 1),
                 action=action,
                 context=tuple(_text(c, f"{where}.context")
                               for c in _list(m.get("context") or [], f"{where}.context",
                                              MAX_CONTEXT)))


def _hit_of(d: Mapping[str, Any]) -> Hit:
    h = _head(d, "hit", ts=False)
    return Hit(h.job, h.attempt, h.node, match_of(_get(d, "m", "hit")), run_id=h.run_id)


def _pair(x: Any, field: str) -> tuple[Any, ...]:
    if type(x) is not list and type(x) is not tuple:
        raise _bad(field, "must be a list", x)
    return tuple(x)


def _output_of(d: Mapping[str, Any]) -> Output:
    h = _head(d, "out")
    ranks = []
    for x in _list(_get(d, "ranks", "out"), "out.ranks", MAX_RANK):
        # the checks below inline (one per rank and output): a rank of None or in
        # [0, MAX_RANK], a finite time in [0, MAX_TS]; anything else takes the slow path,
        # which raises the same error as ever
        if type(x) is list and len(x) == 2:
            r, t = x
            if (r is None or (type(r) is int and 0 <= r <= MAX_RANK)) \
                    and (type(t) is float or type(t) is int) and 0.0 <= t <= MAX_TS:
                ranks.append((r, float(t)))
                continue
        p = _pair(x, "out.ranks")
        if len(p) != 2:
            raise _bad("out.ranks", "items must be [rank, ts]", x)
        ranks.append((_opt_int(p[0], "out.ranks rank", 0, MAX_RANK), _num(p[1], "out.ranks ts")))
    tail = []
    for x in _list(_get(d, "tail", "out"), "out.tail", MAX_TAIL):
        p = _pair(x, "out.tail")
        if len(p) != 3:
            raise _bad("out.tail", "items must be [rank, ts, text]", x)
        tail.append(TailLine(_opt_int(p[0], "out.tail rank", 0, MAX_RANK),
                             _num(p[1], "out.tail ts"), _text(p[2], "out.tail text")))
    return Output(h.job, h.attempt, h.node, h.ts,
                  _int(_get(d, "count", "out"), "out.count", 0, MAX_LINES),
                  rank_last_ts=tuple(ranks), tail=tuple(tail), run_id=h.run_id)


def _mark_of(x: Any, where: str) -> RankStep:
    """One [rank, ts, step, total] mark of a `progs` signal, every field checked."""
    if (type(x) is not list and type(x) is not tuple) or len(x) != 4:
        raise _bad(where, "must be [rank, ts, step, total]", x)
    rank, ts, step, total = x
    return RankStep(_opt_int(rank, f"{where}.rank", 0, MAX_RANK), _num(ts, f"{where}.ts"),
                    _int(step, f"{where}.step", -MAX_STEP, MAX_STEP),
                    _opt_int(total, f"{where}.total", 0, MAX_STEP))


def _progress_batch_of(d: Mapping[str, Any]) -> ProgressBatch:
    """A `progs` signal: every rank's last step of a batch, `marks` [[rank, ts, step, total],
    ...] in line order (the single-rank `prog` form is still decoded as Progress). A mark of
    the usual shape passes one inline check (a subset of what _mark_of accepts: NaN and
    infinities fail its range tests); any other goes through _mark_of, which names the
    field it refuses."""
    h = _head(d, "progs", ts=False)
    rows = _list(_get(d, "marks", "progs"), "progs.marks", MAX_LINES)
    if not rows:
        raise _bad("progs.marks", "must not be empty", rows)
    marks = []
    for i, x in enumerate(rows):
        if type(x) is list and len(x) == 4:
            rank, ts, step, total = x
            if (rank is None or (type(rank) is int and 0 <= rank <= MAX_RANK)) \
                    and type(ts) is float and 0.0 <= ts <= MAX_TS \
                    and type(step) is int and -MAX_STEP <= step <= MAX_STEP \
                    and (total is None or (type(total) is int and 0 <= total <= MAX_STEP)):
                marks.append(RankStep(rank, ts, step, total))
                continue
        marks.append(_mark_of(x, f"progs.marks[{i}]"))
    return ProgressBatch(h.job, h.attempt, h.node, tuple(marks), h.run_id)


def _src(d: Mapping[str, Any], where: str) -> str:
    return safe_name(d.get("src", "log"), f"{where}.src")


_SIGNAL_DECODERS: dict[str, Callable[[Mapping[str, Any]], Signal]] = {
    "start": run_start_of, "hb": heartbeat_of, "exit": exit_of, "note": notice_of,
    "hit": _hit_of, "out": _output_of,
    "prog": lambda d: _progress(_head(d, "prog"), d, "prog", _src(d, "prog")),
    "progs": _progress_batch_of,
    "stage": lambda d: _stage(_head(d, "stage"), d, "stage", _src(d, "stage"),
                              _get(d, "opens", "stage")),
}


def signal_of(d: Mapping[str, Any]) -> Signal:
    """The Signal of one signals-topic element (a record of its own or a bundle's)."""
    t = d.get("t")
    dec = _SIGNAL_DECODERS.get(t) if type(t) is str else None
    if dec is None:
        raise _bad("signal type", "unknown", t)
    return dec(d)


@dataclass(frozen=True, slots=True)
class Tick:
    """A signals-topic clock record: the processor's time when it was sent (per partition)."""

    now: float


def encode_tick(now: float) -> bytes:
    return orjson.dumps({"v": SCHEMA_VERSION, "t": "tick", "now": now})


def signals_of_record(d: Mapping[str, Any]) -> list[Signal]:
    """The signals of a decoded signals-topic dict: a bundle's, or the single one."""
    if d.get("t") != "bundle":
        return [signal_of(d)]
    job = safe_name(_get(d, "job", "bundle"), "bundle.job")
    out = []
    for i, x in enumerate(_list(_get(d, "sigs", "bundle"), "bundle.sigs", MAX_SIGS)):
        if type(x) is not dict:
            raise _bad(f"bundle.sigs[{i}]", "must be an object", x)
        sig = signal_of(x)
        if sig.job != job:
            raise _bad(f"bundle.sigs[{i}].job", f"differs from the bundle's job {job!r}",
                       sig.job)
        out.append(sig)
    return out


def decode_signals(value: bytes | None) -> list[Signal] | Tick:
    """One signals-topic record, validated: its signals (a bundle's, or one), or a Tick.
    Raises DecodeError saying what is wrong."""
    d = decode(value)
    if d["t"] == "tick":
        return Tick(_num(_get(d, "now", "tick"), "tick.now"))
    return signals_of_record(d)


# ---- decisions topic ------------------------------------------------------------------

def decision_to_dict(dec: Decision) -> dict[str, Any]:
    """The published JSON shape of a decision (see faultwatch/schemas/decision.schema.json)."""
    return {
        "v": SCHEMA_VERSION,
        "id": dec.id,
        "job": dec.job,
        "attempt": dec.attempt,
        "run_id": dec.run_id,
        "scheduler": dec.scheduler,
        "action": dec.action,
        "targets": {"nodes": list(dec.nodes), "ranks": list(dec.ranks)},
        "reason": {"kind": dec.kind, "rule": dec.rule, "category": dec.category,
                   "message": dec.message},
        "evidence": dec.evidence,
        "budgets": dec.budgets,
        "rules_version": dec.rules_version,
        "ts": dec.ts,
        **({"run_ids": list(dec.run_ids)} if dec.run_ids else {}),
    }


def encode_decision(dec: Decision) -> bytes:
    return orjson.dumps(decision_to_dict(dec))


def _opt_name(x: Any, field: str) -> str | None:
    return None if x is None else safe_name(x, field)


def decision_of(d: Mapping[str, Any]) -> Decision:
    """The Decision of a decoded decisions-topic dict, every field checked."""
    if d.get("v") != SCHEMA_VERSION:
        raise _bad("decision.v", f"must be {SCHEMA_VERSION}", d.get("v"))
    action = _get(d, "action", "decision")
    if action not in ACTIONS:
        raise _bad("decision.action", f"must be one of {ACTIONS}", action)
    targets = _obj(_get(d, "targets", "decision"), "decision.targets")
    reason = _obj(_get(d, "reason", "decision"), "decision.reason")
    return Decision(
        id=safe_name(_get(d, "id", "decision"), "decision.id"),
        job=safe_name(_get(d, "job", "decision"), "decision.job"),
        attempt=_int(_get(d, "attempt", "decision"), "decision.attempt", 0, MAX_ATTEMPT),
        action=action,
        kind=safe_name(_get(reason, "kind", "decision.reason"), "decision.reason.kind"),
        ts=_num(_get(d, "ts", "decision"), "decision.ts"),
        nodes=tuple(safe_name(n, "decision.targets.nodes")
                    for n in _list(_get(targets, "nodes", "decision.targets"),
                                   "decision.targets.nodes")),
        ranks=tuple(_int(r, "decision.targets.ranks", 0, MAX_RANK)
                    for r in _list(_get(targets, "ranks", "decision.targets"),
                                   "decision.targets.ranks")),
        rule=_opt_name(reason.get("rule"), "decision.reason.rule"),
        category=_opt_name(reason.get("category"), "decision.reason.category"),
        message=_text(reason.get("message", ""), "decision.reason.message"),
        evidence=_json_obj(d.get("evidence", {}), "decision.evidence"),
        budgets=_json_obj(d.get("budgets", {}), "decision.budgets"),
        rules_version=_text(d.get("rules_version", ""), "decision.rules_version", MAX_ID_CHARS),
        run_id=safe_name(d.get("run_id", ""), "decision.run_id", empty_ok=True),
        scheduler=_scheduler(d.get("scheduler") or {}, "decision"),
        run_ids=tuple(safe_name(r, "decision.run_ids")
                      for r in _list(d.get("run_ids") or [], "decision.run_ids", MAX_ITEMS)))


def decode_decision(value: bytes | None) -> Decision:
    """One decisions-topic record, validated. Raises DecodeError saying what is wrong."""
    return decision_of(_load_object(value))


# ---- status topic (compacted: the latest snapshot per job, for `faultwatch status`) --------

def encode_status(snapshot: Mapping[str, Any]) -> bytes:
    """A job's status snapshot (faultwatch.status.snapshot) as a status-topic record."""
    return orjson.dumps({**snapshot, "v": SCHEMA_VERSION, "t": "status"})


def decode_status(value: bytes | None) -> dict[str, Any]:
    """One status-topic record: versioned, typed, with a safe job name and a finite time."""
    d = decode(value)
    if d["t"] != "status":
        raise _bad("status.t", "must be 'status'", d["t"])
    safe_name(_get(d, "job", "status"), "status.job")
    _int(_get(d, "attempt", "status"), "status.attempt", 0, MAX_ATTEMPT)
    _num(_get(d, "ts", "status"), "status.ts")
    return d


# ---- nodes topic (the fleet-wide node registry, compacted, key = node) --------------------

def node_key(node: str) -> bytes:
    return node.encode()


def encode_node(rec: NodeRecord) -> bytes:
    return orjson.dumps({"v": SCHEMA_VERSION, "t": "node", **rec.to_dict()})


def decode_node(value: bytes | None) -> NodeRecord:
    """One nodes-topic record, validated. Raises DecodeError saying what is wrong."""
    d = _load_object(value)
    if d.get("v") != SCHEMA_VERSION or d.get("t") != "node":
        raise _bad("node", f"must be a v{SCHEMA_VERSION} 'node' record",
                   f"v={d.get('v')!r} t={d.get('t')!r}")
    state = _get(d, "state", "node")
    if state not in NODE_STATES:
        raise _bad("node.state", f"must be one of {NODE_STATES}", state)
    reasons = []
    for r in _list(d.get("reasons", []), "node.reasons")[-MAX_REASONS:]:
        r = _obj(r, "node.reasons[]")
        rule, line = r.get("rule"), r.get("line")
        reasons.append(NodeReason(
            ts=_num(_get(r, "ts", "node.reasons[]"), "node.reasons[].ts"),
            event=safe_name(_get(r, "event", "node.reasons[]"), "node.reasons[].event"),
            decision=safe_name(r.get("decision", ""), "node.reasons[].decision", empty_ok=True),
            rule=None if rule is None else safe_name(rule, "node.reasons[].rule"),
            line=None if line is None else _text(line, "node.reasons[].line"),
            job=safe_name(r.get("job", ""), "node.reasons[].job", empty_ok=True)))
    return NodeRecord(node=safe_name(_get(d, "node", "node"), "node.node"), state=state,
                      until=_opt_num(d.get("until"), "node.until"),
                      strikes=_int(_get(d, "strikes", "node"), "node.strikes", 0, 1_000_000),
                      reasons=tuple(reasons), updated_ts=_num(d.get("updated_ts", 0.0),
                                                              "node.updated_ts"),
                      probation=_bool(d.get("probation", False), "node.probation"))
