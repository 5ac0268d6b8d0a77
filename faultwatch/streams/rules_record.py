"""The rules-topic record: a pushed rule set as one record on the compacted topic
`<prefix>rules` (key `ruleset`), built from files and validated back into a rule set.

    {"v": 1, "version": "<content hash>", "files": [{"name": "x.yaml", "text": "..."}],
     "pushed_at": 1714557600.0, "builtin": true}
"""

from __future__ import annotations

import os
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import orjson

from faultwatch.errors import DecodeError, RuleError, RuleProblem
from faultwatch.rules import RuleSet
from faultwatch.rules.loader import merge_texts

RULESET_KEY = b"ruleset"
RECORD_VERSION = 1



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
                 now: float | None = None) -> tuple[bytes, RuleSet]:
    """The rules-topic record for these files, or RuleError with every problem (path:line)."""
    files, problems = read_rule_files(paths)
    if problems:
        raise RuleError(problems)
    ruleset, problems = merge_texts(files, builtin=builtin)
    if problems:
        raise RuleError(problems)
    record = orjson.dumps({
        "v": RECORD_VERSION, "version": ruleset.version,
        "files": [{"name": os.path.basename(name), "text": text} for name, text in files],
        "pushed_at": time.time() if now is None else now, "builtin": builtin})
    return record, ruleset


def ruleset_of_record(value: bytes) -> tuple[RuleSet, dict[str, Any]]:
    """(rule set, decoded record) of a rules-topic record.

    Raises DecodeError for a record that is not a rule set and RuleError (problems named by
    the pushed files' names) for a rule set that does not validate.
    """
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
    files = [(f["name"], f["text"]) for f in raw_files]
    ruleset, problems = merge_texts(files, builtin=d.get("builtin", True) is not False)
    if problems:
        raise RuleError(problems)
    return ruleset, d
