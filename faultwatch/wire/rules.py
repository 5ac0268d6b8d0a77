"""The rules topic (compacted, operators -> processors): a pushed rule set as one record, its
keys (`ruleset`: the set in force; `revision/<n>`: the last pushes, for history and
rollback) and its size budget (MAX_RULESET_RECORD_BYTES, gzipped on the wire).

    {"v": 1, "version": "<content hash>", "files": [{"name": "x.yaml", "text": "..."}],
     "pushed_at": 1714557600.0, "builtin": true,
     "push_id": "5f3e0c1a9b2d", "author": "alice@ops-1", "mode": "add"}

`push_id`, `author`, `mode` and `revision` are optional when read; a rollback adds
`rollback_of` and `from_revision`. Building the rule set from it is rollout/rules_record.py's."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import orjson

from faultwatch.errors import DecodeError
from faultwatch.wire._check import MAX_RULESET_RECORD_BYTES

RULESET_KEY = b"ruleset"
RECORD_VERSION = 1
REVISION_PREFIX = b"revision/"
MAX_REVISIONS = 10  # revisions kept on the topic (kubectl's revisionHistoryLimit is 10 too)
MAX_BYTES = MAX_RULESET_RECORD_BYTES


def revision_key(n: int) -> bytes:
    """The key revision `n` is also written under (the last MAX_REVISIONS survive)."""
    return REVISION_PREFIX + str(n % MAX_REVISIONS).encode()


def encode_ruleset(version: str, files: Sequence[tuple[str, str]], *, pushed_at: float,
                   builtin: bool, push_id: str, author: str, **extra: Any) -> bytes:
    """The record of a push: `files` as (base name, text); `extra` fields (`revision`,
    `rollback_of`, `from_revision`) go in when not None."""
    return orjson.dumps({
        "v": RECORD_VERSION, "version": version,
        "files": [{"name": name, "text": text} for name, text in files],
        "pushed_at": pushed_at, "builtin": builtin, "push_id": push_id, "author": author,
        "mode": "add", **{k: v for k, v in extra.items() if v is not None}})


def decode_ruleset(value: bytes | None) -> dict[str, Any]:
    """A rules record's dict, its shape checked (v, files as {name, text} strings);
    DecodeError for a record that is not a rule set."""
    if value is None:
        raise DecodeError("rules record is empty (a tombstone)")
    try:
        d = orjson.loads(value)
    except orjson.JSONDecodeError as e:
        raise DecodeError(f"rules record is not JSON: {e}") from None
    if not isinstance(d, dict) or d.get("v") != RECORD_VERSION:
        raise DecodeError(f"unsupported rules record (expected an object with v={RECORD_VERSION})")
    raw_files = d.get("files")
    if not isinstance(raw_files, list) or not all(
            isinstance(f, dict) and isinstance(f.get("name"), str)
            and isinstance(f.get("text"), str) for f in raw_files):
        raise DecodeError("rules record: files must be a list of {name, text} strings")
    return d
