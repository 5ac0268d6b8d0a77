"""The holds topic (`<prefix>holds`, compacted, key `<kind>/<job>`): an operator's hold or mute
of one job (core/holds.py), signed with an operator key (trust purpose `hold`).

    {"v": 1, "t": "hold", "kind": "hold", "job": "llama-7b", "at": 1714557600.0,
     "until": 1714564800.0, "reason": "debugging", "by": "alice@ops-1", "id": "5f3e0c1a9b2d",
     "released": false, "seq": 3, "signature": {...}}

`seq` is one more than the record of that kind and job the writer read (0 when none, and
for records written before it existed): followers order records by (seq, at).
"""

from __future__ import annotations

from typing import Any

import orjson

from faultwatch.core.holds import KINDS, MAX_BY_CHARS, MAX_HOLD_S, MAX_REASON_CHARS, Hold
from faultwatch.errors import DecodeError
from faultwatch.wire._check import (
    SCHEMA_VERSION,
    _bad,
    _bool,
    _get,
    _int,
    _num,
    _text,
    decode,
    safe_name,
)

MAX_HOLD_RECORD_BYTES = 4096  # a longer record is refused before it is parsed


def hold_key(kind: str, job: str) -> bytes:
    return f"{kind}/{job}".encode()


def hold_dict(h: Hold) -> dict[str, Any]:
    """The record of `h`, unsigned (trust.records.RecordSigner signs it)."""
    return {"v": SCHEMA_VERSION, "t": "hold", **h.to_dict()}


def encode_hold(record: dict[str, Any]) -> bytes:
    value = orjson.dumps(record)
    if len(value) > MAX_HOLD_RECORD_BYTES:
        raise DecodeError(f"a hold record of {len(value)} bytes (at most "
                          f"{MAX_HOLD_RECORD_BYTES})")
    return value


def decode_hold(value: bytes | None) -> tuple[Hold, dict[str, Any]]:
    """(the hold, the raw record its signature is checked on) of a holds-topic record;
    DecodeError saying which field is wrong."""
    if value is not None and len(value) > MAX_HOLD_RECORD_BYTES:
        raise DecodeError(f"a hold record of {len(value)} bytes (at most "
                          f"{MAX_HOLD_RECORD_BYTES})")
    d = decode(value)
    if d["t"] != "hold":
        raise _bad("hold.t", "must be 'hold'", d["t"])
    kind = _get(d, "kind", "hold")
    if kind not in KINDS:
        raise _bad("hold.kind", f"must be one of {KINDS}", kind)
    at = _num(_get(d, "at", "hold"), "hold.at")
    until = _num(_get(d, "until", "hold"), "hold.until")
    if until - at > MAX_HOLD_S + 60.0:  # a consumer holds no job longer than a writer may
        raise _bad("hold.until", f"more than {MAX_HOLD_S:g} s after hold.at", until)
    return Hold(kind=kind, job=safe_name(_get(d, "job", "hold"), "hold.job"), at=at,
                until=until, reason=_text(d.get("reason", ""), "hold.reason", MAX_REASON_CHARS),
                by=_text(d.get("by", ""), "hold.by", MAX_BY_CHARS),
                id=safe_name(d.get("id", ""), "hold.id", empty_ok=True),
                released=_bool(d.get("released", False), "hold.released"),
                seq=_int(d.get("seq", 0), "hold.seq", 0, 2**53)), d
