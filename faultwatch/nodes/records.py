"""Node registry records on the compacted `<prefix>nodes` topic: encode, decode, validate."""

from __future__ import annotations

import math
import re
from typing import Any

import orjson

from faultwatch.errors import DecodeError
from faultwatch.nodes.registry import MAX_REASONS, STATES, NodeRecord, Reason

SCHEMA_VERSION = 1
RECORD_TYPE = "node"
MAX_ID_CHARS = 256
MAX_TEXT_CHARS = 4096
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")


def node_key(node: str) -> bytes:
    """The nodes topic is compacted by node name."""
    return node.encode()


def encode_node(rec: NodeRecord) -> bytes:
    return orjson.dumps({"v": SCHEMA_VERSION, "t": RECORD_TYPE, **rec.to_dict()})


def _id(d: dict[str, Any], name: str, *, empty_ok: bool = False) -> str:
    v = d.get(name, "" if empty_ok else None)
    if not isinstance(v, str) or (not v and not empty_ok) or len(v) > MAX_ID_CHARS \
            or _CONTROL.search(v):
        raise DecodeError(f"node record: {name} must be a non-empty string of at most "
                          f"{MAX_ID_CHARS} characters without control characters, got {v!r:.80}")
    return v


def _num(v: Any, name: str, *, optional: bool = False) -> float | None:
    if v is None and optional:
        return None
    if type(v) not in (int, float) or not math.isfinite(v):
        raise DecodeError(f"node record: {name} must be a finite number, got {v!r:.80}")
    return float(v)


def _text(v: Any, name: str) -> str | None:
    if v is None:
        return None
    if not isinstance(v, str):
        raise DecodeError(f"node record: {name} must be a string or null, got {v!r:.80}")
    return v[:MAX_TEXT_CHARS]


def _reason(d: Any) -> Reason:
    if not isinstance(d, dict):
        raise DecodeError("node record: a reason is not an object")
    ts = _num(d.get("ts"), "reasons[].ts")
    assert ts is not None
    return Reason(ts=ts, event=_id(d, "event"), decision=_id(d, "decision", empty_ok=True),
                  rule=_text(d.get("rule"), "reasons[].rule"),
                  line=_text(d.get("line"), "reasons[].line"),
                  job=_id(d, "job", empty_ok=True))


def decode_node(value: bytes | None) -> NodeRecord:
    """Decode and validate a nodes-topic record, or raise DecodeError saying what is wrong."""
    if value is None:
        raise DecodeError("node record: empty value (tombstone)")
    try:
        d = orjson.loads(value)
    except orjson.JSONDecodeError as e:
        raise DecodeError(f"node record: not JSON: {e}") from None
    if not isinstance(d, dict):
        raise DecodeError("node record: not a JSON object")
    if d.get("v") != SCHEMA_VERSION or d.get("t") != RECORD_TYPE:
        raise DecodeError(f"node record: expected v={SCHEMA_VERSION} t={RECORD_TYPE!r}, got "
                          f"v={d.get('v')!r} t={d.get('t')!r}")
    state = d.get("state")
    if state not in STATES:
        raise DecodeError(f"node record: state must be one of {', '.join(STATES)}, "
                          f"got {state!r:.40}")
    strikes = d.get("strikes")
    if type(strikes) is not int or not 0 <= strikes <= 1_000_000:
        raise DecodeError(f"node record: strikes must be an integer >= 0, got {strikes!r:.40}")
    reasons = d.get("reasons", [])
    if not isinstance(reasons, list):
        raise DecodeError("node record: reasons must be a list")
    probation = d.get("probation", False)
    if not isinstance(probation, bool):
        raise DecodeError("node record: probation must be a boolean")
    updated = _num(d.get("updated_ts", 0.0), "updated_ts")
    assert updated is not None
    return NodeRecord(node=_id(d, "node"), state=state,
                      until=_num(d.get("until"), "until", optional=True), strikes=strikes,
                      reasons=tuple(_reason(r) for r in reasons[-MAX_REASONS:]),
                      updated_ts=updated, probation=probation)
