"""The dead-letter topic: a record a processor could not decode, with where it came from and
why; the value kept (base64) up to a budget so the record fits one Kafka record."""

from __future__ import annotations

import base64
import binascii
from typing import Any

import orjson

from faultwatch.wire._check import SCHEMA_VERSION, _bad, _get, _int, _load_object, _text

MAX_DEAD_VALUE_BYTES = 600_000  # of the bad value kept (base64 adds a third: under 900 kB)
MAX_DEAD_ERROR_CHARS = 4096


def encode_dead(topic: str, partition: int, offset: int, error: str,
                value: bytes | None) -> bytes:
    """The dead letter of one record that did not decode."""
    return orjson.dumps({
        "v": SCHEMA_VERSION, "topic": topic, "partition": partition, "offset": offset,
        "error": error[:MAX_DEAD_ERROR_CHARS],
        "value_b64": base64.b64encode((value or b"")[:MAX_DEAD_VALUE_BYTES]).decode()})


def decode_dead(value: bytes | None) -> dict[str, Any]:
    """A dead letter as a dict, its fields checked (DecodeError otherwise)."""
    d = _load_object(value)
    raw = _text(d.get("value_b64", ""), "dead.value_b64", MAX_DEAD_VALUE_BYTES * 2)
    try:
        kept = base64.b64decode(raw, validate=True)
    except (ValueError, binascii.Error):
        raise _bad("dead.value_b64", "not base64", raw[:40]) from None
    return {"topic": _text(_get(d, "topic", "dead"), "dead.topic", 1024),
            "partition": _int(_get(d, "partition", "dead"), "dead.partition", 0, 1 << 31),
            "offset": _int(_get(d, "offset", "dead"), "dead.offset", -1, 1 << 62),
            "error": _text(_get(d, "error", "dead"), "dead.error", MAX_DEAD_ERROR_CHARS),
            "value": kept}
