"""The signals topic (matcher -> job stage): signals as plain dicts, bundles of one job's
signals bounded in size, clock ticks, and the validated decode of every signal type."""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from functools import partial
from typing import Any

import orjson

from faultwatch.core.events import (
    ACTIONS,
    Exit,
    Heartbeat,
    Hit,
    LossBatch,
    Match,
    Notice,
    Output,
    Progress,
    ProgressBatch,
    RankLoss,
    RankStep,
    RunStart,
    Signal,
    Stage,
    TailLine,
)
from faultwatch.wire._check import (
    MAX_CONTEXT,
    MAX_LINES,
    MAX_RANK,
    MAX_RECORD_BYTES,
    MAX_SIGS,
    MAX_STEP,
    MAX_TAIL,
    MAX_TEXT_CHARS,
    MAX_TS,
    SCHEMA_VERSION,
    _bad,
    _bool,
    _get,
    _head,
    _int,
    _list,
    _num,
    _obj,
    _opt_int,
    _text,
    decode,
    safe_name,
)
from faultwatch.wire.events import (
    _progress,
    _stage,
    exit_of,
    heartbeat_of,
    notice_of,
    run_start_dict,
    run_start_of,
)

_new_tail = partial(tuple.__new__, TailLine)  # a TailLine of a checked [rank, ts, text] row

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
        d = {"t": "exit", **head, "ts": sig.ts, "exit_code": sig.exit_code,
             "signal": sig.signal, "run_id": sig.run_id}
        if sig.stopped:  # only when set: records of older agents stay as they were
            d["stopped"] = True
        return d
    if isinstance(sig, RunStart):
        return run_start_dict(sig)
    if isinstance(sig, Progress):
        d = {"t": "prog", **head, "ts": sig.ts, "rank": sig.rank, "step": sig.step,
             "src": sig.source}
        if sig.total is not None:
            d["total"] = sig.total
        if sig.step_time_s is not None:
            d["step_time_s"] = sig.step_time_s
        if sig.loss is not None:
            d["loss"] = _loss_value(sig.loss)
        return _with_run(d, sig.run_id)
    if isinstance(sig, ProgressBatch):
        return _with_run({"t": "progs", **head, "marks": [tuple(m) for m in sig.marks]},
                         sig.run_id)
    if isinstance(sig, LossBatch):
        return _with_run({"t": "loss", **head,
                          "marks": [(m.rank, m.ts, _loss_value(m.value), m.key)
                                    for m in sig.marks]}, sig.run_id)
    if isinstance(sig, Stage):
        d = {"t": "stage", **head, "ts": sig.ts, "rank": sig.rank, "stage": sig.stage,
             "opens": sig.opens, "hang_window_s": sig.hang_window_s, "src": sig.source}
        if sig.step is not None:
            d["step"] = sig.step
        return _with_run(d, sig.run_id)
    if isinstance(sig, Notice):
        return _with_run({"t": "note", **head, "ts": sig.ts, "kind": sig.kind,
                          "data": dict(sig.data)}, sig.run_id)
    raise TypeError(f"not a signal: {sig!r}")


def encode_signal(sig: Signal) -> bytes:
    """One signal as a signals-topic record."""
    return orjson.dumps({"v": SCHEMA_VERSION, **signal_dict(sig)})


_BUNDLE_OVERHEAD = 64  # {"v":1,"t":"bundle","job":...,"sigs":[...]} around the elements


def bundle_head_bytes(job: str) -> int:
    """Bytes a bundle of `job` takes besides its elements (an upper bound)."""
    return len(orjson.dumps(job)) + _BUNDLE_OVERHEAD


def _bundle(job: str, elements: Sequence[bytes]) -> bytes:
    return b'{"v":%d,"t":"bundle","job":%s,"sigs":[%s]}' % (
        SCHEMA_VERSION, orjson.dumps(job), b",".join(elements))


def encode_bundles(job: str, elements: Sequence[bytes],
                   max_bytes: int = MAX_RECORD_BYTES) -> list[bytes]:
    """Several signals of one job, in order, as signals-topic records of `t: bundle`, as few
    as fit `max_bytes` each (the matcher sends one per job per batch instead of one record
    per signal; decode_signals unpacks them). The elements are encoded signal dicts
    (orjson.dumps(signal_dict(s))); each must fit a record on its own, else ValueError."""
    head = bundle_head_bytes(job)
    out: list[bytes] = []
    chunk: list[bytes] = []
    size = head
    for raw in elements:
        if len(raw) + head > max_bytes:
            raise ValueError(f"a signal of job {job!r} is {len(raw)} bytes (limit {max_bytes})")
        if chunk and size + len(raw) + 1 > max_bytes:
            out.append(_bundle(job, chunk))
            chunk, size = [], head
        chunk.append(raw)
        size += len(raw) + 1
    if chunk:
        out.append(_bundle(job, chunk))
    return out


def encode_bundle(job: str, sigs: Sequence[Signal | dict[str, Any]]) -> bytes:
    """Several signals (or signal_dict()s) of one job, in order, as ONE bundle record of any
    size (tests and tools; the matcher bounds its records with encode_bundles)."""
    return _bundle(job, [orjson.dumps(s if isinstance(s, dict) else signal_dict(s))
                         for s in sigs])


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
        # a row of the usual shape passes one inline check (what the field checks below
        # accept); any other takes them, and they name what is wrong
        if type(x) is list and len(x) == 3:
            r, t, text = x
            if (r is None or (type(r) is int and 0 <= r <= MAX_RANK)) \
                    and type(t) is float and 0.0 <= t <= MAX_TS \
                    and type(text) is str and len(text) <= MAX_TEXT_CHARS:
                tail.append(_new_tail(x))
                continue
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


_NONFINITE = {"nan": math.nan, "inf": math.inf, "-inf": -math.inf}


def _loss_value(v: float) -> float | str:
    """A loss on the wire: a JSON number, or "nan" / "inf" / "-inf" (JSON has none)."""
    if math.isfinite(v):
        return v
    return "nan" if math.isnan(v) else ("inf" if v > 0 else "-inf")


def _loss_batch_of(d: Mapping[str, Any]) -> LossBatch:
    """A `loss` signal: the training-loss values of a batch of lines, `marks` [[rank, ts,
    value, key], ...] in line order; value a number or "nan" / "inf" / "-inf"."""
    h = _head(d, "loss", ts=False)
    rows = _list(_get(d, "marks", "loss"), "loss.marks", MAX_LINES)
    if not rows:
        raise _bad("loss.marks", "must not be empty", rows)
    marks = []
    for i, x in enumerate(rows):
        where = f"loss.marks[{i}]"
        if (type(x) is not list and type(x) is not tuple) or len(x) != 4:
            raise _bad(where, "must be [rank, ts, value, key]", x)
        rank, ts, value, key = x
        if type(value) is str and value in _NONFINITE:
            v = _NONFINITE[value]
        elif type(value) in (int, float) and math.isfinite(value):
            v = float(value)
        else:
            raise _bad(f"{where}.value", 'must be a finite number or "nan", "inf", "-inf"',
                       value)
        marks.append(RankLoss(_opt_int(rank, f"{where}.rank", 0, MAX_RANK),
                              _num(ts, f"{where}.ts"), v, safe_name(key, f"{where}.key")))
    return LossBatch(h.job, h.attempt, h.node, tuple(marks), h.run_id)


def _src(d: Mapping[str, Any], where: str) -> str:
    return safe_name(d.get("src", "log"), f"{where}.src")


_SIGNAL_DECODERS: dict[str, Callable[[Mapping[str, Any]], Signal]] = {
    "start": run_start_of, "hb": heartbeat_of, "exit": exit_of, "note": notice_of,
    "hit": _hit_of, "out": _output_of,
    "prog": lambda d: _progress(_head(d, "prog"), d, "prog", _src(d, "prog")),
    "progs": _progress_batch_of,
    "loss": _loss_batch_of,
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


# one signal's text is cut to these before it is bundled (a hit's line and traceback context,
# an output's tail lines): evidence stays readable, records and job states stay small
MAX_LINE_CHARS = 2048
MAX_CONTEXT_LINE_CHARS = 512
MAX_CONTEXT_CHARS = 6144


def cap_signal(d: dict[str, Any]) -> dict[str, Any]:
    """The signal dict with its free texts cut to the caps above (a copy when cut)."""
    if d.get("t") == "hit":
        m = d["m"]
        line = m.get("line")
        ctx = m.get("context") or ()
        if (isinstance(line, str) and len(line) > MAX_LINE_CHARS) or \
                sum(len(c) for c in ctx if isinstance(c, str)) > MAX_CONTEXT_CHARS or \
                any(isinstance(c, str) and len(c) > MAX_CONTEXT_LINE_CHARS for c in ctx):
            kept: list[str] = []
            total = 0
            for c in ctx:
                c = c[:MAX_CONTEXT_LINE_CHARS] if isinstance(c, str) else c
                total += len(c) if isinstance(c, str) else 0
                if total > MAX_CONTEXT_CHARS:
                    break
                kept.append(c)
            m = {**m, "context": kept}
            if isinstance(line, str):
                m["line"] = line[:MAX_LINE_CHARS]
            return {**d, "m": m}
    if d.get("t") == "out":
        tail = d.get("tail") or ()
        if any(isinstance(t[2], str) and len(t[2]) > MAX_LINE_CHARS for t in tail):
            return {**d, "tail": [(r, ts, txt[:MAX_LINE_CHARS]) for r, ts, txt in tail]}
    return d
