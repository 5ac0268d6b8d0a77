"""Choosing the root error of a failure: the earliest error that is not a downstream symptom."""

from __future__ import annotations

from collections.abc import Sequence

from faultwatch.core.events import Match

DEFAULT_ACTIONS = {"retryable": "restart", "hardware": "blacklist", "fatal": "fail"}


def pick_root(matches: Sequence[Match]) -> Match | None:
    """Earliest non-cascade match (by time, then sequence); else the earliest cascade one."""
    if not matches:
        return None
    roots = [m for m in matches if not m.cascade]
    pool = roots or list(matches)
    return min(pool, key=lambda m: (m.stream == "exit", m.ts, m.seq))


def default_action(category: str) -> str | None:
    """The action a category implies when the rule does not override it."""
    return DEFAULT_ACTIONS.get(category)
