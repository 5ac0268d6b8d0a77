"""The one rule for names (jobs, nodes, runs, ids): what the wire accepts, actuators pass and
the agent takes from its flags and the scheduler's environment."""

from __future__ import annotations

import re
import unicodedata
from typing import Any

MAX_NAME_CHARS = 256  # job, node, run and decision ids, rule ids, stage names, note kinds
CONTROL_RE = re.compile("[\x00-\x1f\x7f-\x9f]")  # C0, DEL and C1
# beyond ASCII also format characters (bidi overrides, zero widths) and the line and
# paragraph separators: they reorder or break what a terminal or a log shows
INVISIBLE_CATEGORIES = ("Cf", "Zl", "Zp")


def name_problem(x: Any, *, empty_ok: bool = False) -> str | None:
    """Why `x` is not a name (a string of at most MAX_NAME_CHARS characters without control
    characters, not empty unless allowed), or None. The wire's decoders (wire's safe_name)
    and the actuators (nodes.names.valid_job) both ask this, each raising its own error."""
    if type(x) is not str:
        return "must be a string"
    if not x and not empty_ok:
        return "must not be empty"
    if len(x) > MAX_NAME_CHARS:
        return f"longer than {MAX_NAME_CHARS} characters"
    if CONTROL_RE.search(x) is not None:  # one C scan (a per-char genexpr cost 10% a stage)
        return "contains a control character"
    if not x.isascii() and any(unicodedata.category(c) in INVISIBLE_CATEGORIES for c in x):
        return "contains a control character"
    return None


def did_you_mean(word: str, known: Any, n: int = 3) -> str:
    """` (did you mean 'x'?)` for the names in `known` close to `word` (difflib's ratio of
    at least 0.6, as Python's own "Did you mean" on a misspelt name), or "" when none is."""
    import difflib

    close = difflib.get_close_matches(word, [str(k) for k in known], n=n)
    if not close:
        return ""
    return " (did you mean " + " or ".join(repr(c) for c in close) + "?)"
