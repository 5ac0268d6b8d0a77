"""Choosing the root error of a failure: the earliest error that is not a downstream symptom."""

from __future__ import annotations

from collections.abc import Sequence

from faultwatch.core.events import Match

DEFAULT_ACTIONS = {"retryable": "restart", "hardware": "blacklist", "fatal": "fail"}


def pick_root(matches: Sequence[Match]) -> Match | None:
    """Earliest non-cascade match (by time, then sequence); else the earliest cascade one.
    Two tiers above time order:
    - hardware evidence first: a GPU, link or disk fault shows upstream as software errors
      (NCCL prints "unhandled cuda error" before its "Last error: ... uncorrectable ECC"
      detail; a peer's retryable error may come first), and restarting on the bad node
      repeats the failure, so a non-cascade hardware match is the root whenever one exists;
    - a rule whose action is `notify` says "tell someone, do not act": it is the root only
      when no other root candidate matched (an earlier notice never hides a later error)."""
    if not matches:
        return None
    roots = [m for m in matches if not m.cascade]
    acting = [m for m in roots if m.action != "notify"]
    hardware = [m for m in acting if m.category == "hardware"]
    pool = hardware or acting or roots or list(matches)
    return min(pool, key=lambda m: (m.stream == "exit", m.ts, m.seq))


def default_action(category: str) -> str | None:
    """The action a category implies when the rule does not override it."""
    return DEFAULT_ACTIONS.get(category)
