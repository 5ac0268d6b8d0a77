"""What every record is held to: the schema version, the bounds of every field, the validators
that name the field they refuse, and decode() (the version and type check of any record)."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import orjson

from faultwatch.core.names import MAX_NAME_CHARS, name_problem
from faultwatch.errors import DecodeError

SCHEMA_VERSION = 1

# Kafka's default message.max.bytes is 1 MiB (1,048,588 with overhead): every record
# faultwatch produces (an agent's lines, a matcher's bundle, a decision) stays under this by
# construction, with room for the key and headers. The one exception is the rule-set record,
# gzip-compressed on its own topic: its uncompressed size has its own bound below.
MAX_RECORD_BYTES = 900_000
MAX_RULESET_RECORD_BYTES = 8 << 20  # rule files are <= 1 MiB each; the record is gzipped

# ---- bounds every decoded record is held to (a record outside them is a DecodeError) -----
MAX_ID_CHARS = MAX_NAME_CHARS  # job, node, run and decision ids, rule ids, stage names...
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


# ---- validation primitives: each names the field it rejects ------------------------------

def _bad(field: str, why: str, x: Any) -> DecodeError:
    shown = repr(x)
    return DecodeError(f"{field}: {why}, got {shown[:80]}{'...' if len(shown) > 80 else ''}")




_SAFE_NAMES: set[str] = set()  # non-empty names safe_name accepted (jobs and nodes repeat)
_SAFE_NAMES_MAX = 65_536  # then it starts afresh


def safe_name(x: Any, field: str, *, empty_ok: bool = False) -> str:
    """A name that may become a key, a path part or terminal output: a string of at most
    MAX_ID_CHARS characters without control characters (and not empty unless allowed)."""
    if type(x) is str and x in _SAFE_NAMES:
        return x  # checked before (a fleet's records name the same jobs and nodes)
    problem = name_problem(x, empty_ok=empty_ok)  # the one rule (core/names.py)
    if problem is not None:
        raise _bad(field, problem, x)
    if x:
        if len(_SAFE_NAMES) >= _SAFE_NAMES_MAX:
            _SAFE_NAMES.clear()
        _SAFE_NAMES.add(x)
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



def _scheduler(x: Any, where: str) -> dict[str, object]:
    """A record's `scheduler` object (what the job's scheduler told the agent): JSON with
    safe keys."""
    d = _json_obj(x, f"{where}.scheduler")
    for k in d:
        safe_name(k, f"{where}.scheduler key")
    return d
