"""Classification of a finished failure: the root error among matches, and `classify()`."""

from __future__ import annotations

import re
from collections.abc import Sequence

from faultwatch.core.decide import guard_restart
from faultwatch.core.events import STDERR, Line
from faultwatch.core.failure import failure_outcome, retryable_in
from faultwatch.core.policy import Policy, policy_for
from faultwatch.core.root import pick_root
from faultwatch.rules.engine import Matcher
from faultwatch.rules.model import RuleSet
from faultwatch.rules.normalise import normalise_line
from faultwatch.rules.torchrun import parse_child_failed

_WORKER_FAILED = re.compile(r"failed \(exitcode: (-?\d+)\)")

_MATCHERS: dict[tuple[int, str], Matcher] = {}


def _summary_exit_codes(raw: Sequence[str]) -> list[int]:
    """Exit statuses torchrun reported, signal deaths other than its own SIGTERM first."""
    codes = [f.exit_code if f.signal is None else -f.signal
             for f in parse_child_failed(raw) if f.exit_code is not None]
    codes += [int(m.group(1)) for t in raw if "failed (exitcode:" in t
              for m in [_WORKER_FAILED.search(t)] if m]
    return sorted(dict.fromkeys(codes), key=lambda c: (c >= 0, c == -15))


MAX_EXPLAINED_PREFIXES = 20


def _stripped(raw: Sequence[str]) -> list[dict[str, object]]:
    """What the normaliser took off the lines (the first MAX_EXPLAINED_PREFIXES), for
    --explain: line number, the prefix text, its kinds, and the rank/node it named."""
    out: list[dict[str, object]] = []
    for i, t in enumerate(raw):
        n = normalise_line(t)
        if n.stripped:
            out.append({"lineno": i + 1, "stripped": n.stripped, "kinds": list(n.kinds),
                        "rank": n.rank, "node": n.node})
            if len(out) >= MAX_EXPLAINED_PREFIXES:
                break
    return out


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
             explain: bool = False, policy: Policy | None = None) -> dict[str, object]:
    """How a failure ending with this log (and exit code) would be classified, and what the
    job stage would decide about it under `policy` (the rule set's, by default) as the job's
    first failure: `action` is the pipeline's (`restart`, `blacklist`, `fail`, `notify`),
    never None for a failure; `why` says what changed it from the rule's. A log that ends
    with exit code 0 and matches no rule is no failure: action None."""
    matcher = matcher_for(ruleset)
    raw = text.splitlines()
    lines = [Line(STDERR, i, float(i), t) for i, t in enumerate(raw)]
    batch = matcher.match_lines(lines)
    root = pick_root(batch.matches)
    if root is None or root.cascade:
        # no root error in the log: the exit statuses (the summary's, then the given one) decide
        for code in [*_summary_exit_codes(raw), *([exit_code] if exit_code is not None else [])]:
            em = matcher.match_exit(code, None, float(len(raw)))
            if em is not None and not em.cascade:
                root = em
                break
    out: dict[str, object] = {"category": "unknown", "rule": None, "action": None, "line": None,
                              "why": None}
    if root is not None:
        out = {"category": root.category, "rule": root.rule, "action": None, "line": root.line,
               "why": None}
    if root is not None or exit_code != 0:  # a failure: what the job stage would decide
        pol = policy if policy is not None else policy_for(ruleset.policy)
        category = root.category if root is not None else "unknown"
        action, category, pattern = failure_outcome(
            root, category, pol, lambda: retryable_in(pol.retryable_errors, raw))
        why = f"retryable by pattern {pattern!r}" if pattern is not None else None
        g = guard_restart(action, "", 0.0, pol, 0, ())  # the first failure's budget
        if g.action != action:
            why = g.message.rstrip(": ")
        out.update(category=category, action=g.action, why=why)
    if explain:
        out["prefixes"] = _stripped(raw)
        out["matches"] = [{"rule": m.rule, "category": m.category, "cascade": m.cascade,
                           "rank": m.rank, "line": m.line, "lineno": m.seq + 1}
                          for m in batch.matches]
    return out
