"""The built-in rule set, loaded once per test session (loading compiles every pattern)."""

from __future__ import annotations

import functools

from faultwatch.rules import RuleSet, load_ruleset


@functools.cache
def builtin_ruleset() -> RuleSet:
    """`load_ruleset()`, shared by the tests that only read it (a RuleSet is frozen); each
    load takes seconds of CPU, and the loader's own tests still call `load_ruleset`."""
    return load_ruleset()
