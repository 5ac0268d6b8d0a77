"""A pushed rule set built from files into its rules-topic record (the record's shape and
codec: wire/rules.py), and validated back into a rule set.

    {"v": 1, "version": "<content hash>", "files": [{"name": "x.yaml", "text": "..."}],
     "pushed_at": 1714557600.0, "builtin": true,
     "push_id": "5f3e0c1a9b2d", "author": "alice@ops-1", "mode": "add"}

`push_id`, `author`, `mode` and `revision` (the push's number: rollout/rules_history.py) are
optional when read; a rollback adds `rollback_of` and `from_revision` (the revision it undid,
the one whose files it pushed again). A pushed set is the `pushed` layer ON TOP of each
worker's built-in and `--rules` layers (rules/layers.py); "add" is the only mode. `version`
is the hash of built-in + pushed files, what a worker without `--rules` files runs.
"""

from __future__ import annotations

import getpass
import os
import socket
import time
import uuid
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from faultwatch.errors import RuleError, RuleProblem
from faultwatch.rules import RuleSet
from faultwatch.rules.layers import Layer, build, builtin_layer, texts_layer
from faultwatch.wire.rules import (  # noqa: F401 - re-exported
    RECORD_VERSION,
    RULESET_KEY,
    decode_ruleset,
    encode_ruleset,
)


def read_rule_files(paths: Sequence[str | Path]) -> tuple[list[tuple[str, str]],
                                                          list[RuleProblem]]:
    """(path, text) of each file, and a problem for each file that cannot be read."""
    files: list[tuple[str, str]] = []
    problems: list[RuleProblem] = []
    for p in paths:
        try:
            files.append((str(p), Path(p).read_text(encoding="utf-8")))
        except (OSError, UnicodeDecodeError) as e:
            problems.append(RuleProblem(str(p), 1, f"cannot read rule file: {e}"))
    return files, problems


def build_record(paths: Sequence[str | Path], *, builtin: bool = True,
                 now: float | None = None, **extra: Any) -> tuple[bytes, RuleSet]:
    """The rules-topic record for these files, or RuleError with every problem (path:line).
    `extra` fields (`revision`, `rollback_of`, `from_revision`) go into the record."""
    files, problems = read_rule_files(paths)
    if problems:
        raise RuleError(problems)
    return record_of_texts(files, builtin=builtin, now=now, **extra)


def record_of_texts(files: Sequence[tuple[str, str]], *, builtin: bool = True,
                    now: float | None = None, **extra: Any) -> tuple[bytes, RuleSet]:
    """The rules-topic record of (name, text) files (a rollback's: an earlier revision's),
    or RuleError with every problem."""
    pushed = texts_layer("pushed", files)
    rif, problems = build([*([builtin_layer()] if builtin else []), pushed])
    if rif is None:
        raise RuleError(problems)
    record = encode_ruleset(
        rif.version, [(os.path.basename(name), text) for name, text in files],
        pushed_at=time.time() if now is None else now, builtin=builtin,
        push_id=uuid.uuid4().hex[:12], author=author(), **extra)
    return record, rif.ruleset


def author() -> str:
    """Who pushes: user@host (a name for people, not a credential: see the signatures)."""
    try:
        user = getpass.getuser()
    except (KeyError, OSError):
        user = "?"
    return f"{user}@{socket.gethostname()}"


def layer_of_record(value: bytes, where: str = "") -> tuple[Layer, bool, dict[str, Any]]:
    """(pushed layer, whether the set keeps the built-in layer, decoded record) of a
    rules-topic record; DecodeError for a record that is not a rule set. The layer is
    validated only when built into a set (layers.build)."""
    d = decode_ruleset(value)
    raw_files = d["files"]
    meta = {k: d.get(k) for k in ("push_id", "author", "pushed_at", "revision", "rollback_of")
            if d.get(k) is not None}
    meta["pushed_version"] = d.get("version") if isinstance(d.get("version"), str) else None
    if where:
        meta["at"] = where
    layer = texts_layer("pushed", [(f["name"], f["text"]) for f in raw_files], meta)
    return layer, d.get("builtin", True) is not False, d


def ruleset_of_record(value: bytes, signed: bool = False) -> tuple[RuleSet, dict[str, Any]]:
    """(rule set, decoded record) of a rules-topic record on its own (built-in + pushed).
    `builtin: false` (drop the built-in rules) is honoured only from a record whose operator
    signature was verified (`signed`); from an unsigned record the built-in rules stay.

    Raises DecodeError for a record that is not a rule set and RuleError (problems named by
    the pushed files' names) for a rule set that does not validate.
    """
    layer, keep_builtin, d = layer_of_record(value)
    keep_builtin = keep_builtin or not signed
    rif, problems = build([*([builtin_layer()] if keep_builtin else []), layer])
    if rif is None:
        raise RuleError(problems)
    return rif.ruleset, d
