"""Classification of a finished failure: the root error among matches, and `classify()`."""

from __future__ import annotations

from collections.abc import Sequence

from faultwatch.core.events import STDERR, Line, Match
from faultwatch.rules.engine import Matcher
from faultwatch.rules.model import DEFAULT_ACTIONS, RuleSet

_MATCHERS: dict[tuple[int, str], Matcher] = {}


def pick_root(matches: Sequence[Match]) -> Match | None:
    """The earliest (ts, then seq) non-cascade match; else the earliest cascade one."""
    if not matches:
        return None
    roots = [m for m in matches if not m.cascade]
    return min(roots or matches, key=lambda m: (m.ts, m.seq))


def matcher_for(ruleset: RuleSet) -> Matcher:
    """A cached Matcher for the rule set (compiling the database is the slow part)."""
    key = (id(ruleset), ruleset.version)
    m = _MATCHERS.get(key)
    if m is None or m.ruleset is not ruleset:
        if len(_MATCHERS) > 16:
            _MATCHERS.clear()
        m = _MATCHERS[key] = Matcher(ruleset)
    return m


def classify(ruleset: RuleSet, text: str, exit_code: int | None = None, *,
             explain: bool = False) -> dict[str, object]:
    """How a failure ending with this log (and exit code) would be classified."""
    matcher = matcher_for(ruleset)
    raw = text.splitlines()
    lines = [Line(STDERR, i, float(i), t) for i, t in enumerate(raw)]
    batch = matcher.match_lines(lines)
    root = pick_root(batch.matches)
    if root is None and exit_code is not None:
        root = matcher.match_exit(exit_code, None, float(len(raw)))
    out: dict[str, object] = {"category": "unknown", "rule": None, "action": None, "line": None}
    if root is not None:
        out = {"category": root.category, "rule": root.rule,
               "action": root.action or DEFAULT_ACTIONS.get(root.category), "line": root.line}
    if explain:
        out["matches"] = [{"rule": m.rule, "category": m.category, "cascade": m.cascade,
                           "rank": m.rank, "line": m.line, "lineno": m.seq + 1}
                          for m in batch.matches]
    return out
