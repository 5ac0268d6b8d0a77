"""The logs topic (agent -> matcher): batches of lines as rows or chunks, read lazily
(LineRows), and the typed decode of any logs record (lines, lifecycle, notes)."""

from __future__ import annotations

import bisect
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol, overload

import orjson

from faultwatch.core.events import Exit, Heartbeat, Line, Notice, Progress, RunStart, Stage
from faultwatch.errors import DecodeError
from faultwatch.wire._check import (
    MAX_LINES,
    MAX_RANK,
    MAX_TS,
    SCHEMA_VERSION,
    _bad,
    _get,
    _head,
    _int,
    _list,
    _num,
    _opt_int,
    _text,
    decode,
)
from faultwatch.wire.events import (
    exit_of,
    heartbeat_of,
    note_signal,
    notice_of,
    run_start_of,
)

_STREAM_CODE = {"stdout": "o", "stderr": "e"}
_CODE_STREAM = {"o": "stdout", "e": "stderr"}


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
_TS_TYPES = frozenset({float, int})  # (not bool: _num refuses it)
_FLOAT_TYPES = frozenset({float})


def _times(ts: list[Any]) -> list[float]:
    """A lines record's times, each held to what _row_line's _num holds one to (a number,
    finite, in [0, MAX_TS]) with C loops over the column, as floats (a Line's ts is one)."""
    types = set(map(type, ts))
    if not _TS_TYPES.issuperset(types):
        raise DecodeError("malformed lines record: a line time is not a number")
    try:
        finite = all(map(math.isfinite, ts))
    except OverflowError:  # (an int too large for a float)
        finite = False
    if not finite:
        raise DecodeError("malformed lines record: a line time is not finite")
    if ts and not (0.0 <= min(ts) and max(ts) <= MAX_TS):
        raise DecodeError(f"malformed lines record: a line time is out of range [0, {MAX_TS:g}]")
    return ts if _FLOAT_TYPES.issuperset(types) else list(map(float, ts))


class LineRows(Sequence[Line]):
    """The lines of a decoded record as a lazy sequence. Every text's type and every time
    are checked at once, into two columns (`texts`, `times`: what the matcher reads; text
    sizes are bounded by the record's); a Line object is built, and fully checked, only when
    indexed: the matcher reads every text and a few lines' times, but other fields only of
    the lines a rule hit (stream, seq). An indexed Line is kept: the matcher stage may read
    the same line several times."""

    __slots__ = ("_lines", "_rows", "texts", "times")

    _rows: Sequence[Any]
    _lines: dict[int, Line]  # by the index as it was given (-1 and n-1 are two entries)

    def __init__(self, rows: list[Any]) -> None:
        try:
            texts: list[str] = [r[3] for r in rows]
            ts: list[Any] = [r[2] for r in rows]
        except (IndexError, TypeError, KeyError) as e:
            raise DecodeError(f"malformed lines record: {e!r}") from None
        if not _TEXT_TYPES.issuperset(map(type, texts)):
            raise DecodeError("malformed lines record: a line text is not a string")
        self.times = _times(ts)
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
        self.texts, self.times, self._rows, self._lines = rows.texts, rows.times, rows, {}
        return self


class _ChunkRows(Sequence[list[Any]]):
    """The rows of a chunked `lines` record, built on demand: chunk j holds the lines
    starts[j] .. starts[j+1]-1, its text split at "\n"."""

    __slots__ = ("_chunks", "_starts", "texts", "times")

    def __init__(self, chunks: list[Any]) -> None:
        texts: list[str] = []
        times: list[float] = []  # each line's: its chunk's (checked once per chunk)
        starts: list[int] = []
        for c in chunks:
            if type(c) is not list or len(c) != 6:
                raise _bad("line chunk", "must be [stream, seq0, ts, text, flags, orig_len]", c)
            code, seq, ts, text, flags, orig_len = c
            if type(code) is not str or len(code) > 16:
                raise _bad("line chunk stream", "must be a short string", code)
            _int(seq, "line chunk seq0", -1, 2**63 - 1)
            t = _num(ts, "line chunk ts")
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
            times += [t] * (len(texts) - starts[-1])
        self._chunks, self._starts, self.texts, self.times = chunks, starts, texts, times

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
