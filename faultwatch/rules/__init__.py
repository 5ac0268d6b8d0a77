"""The rule language: loading and validating rule files, the matcher, classification."""

from __future__ import annotations

from faultwatch.rules.classify import classify, pick_root
from faultwatch.rules.engine import Matcher
from faultwatch.rules.loader import BUILTIN_DIR, builtin_paths
from faultwatch.rules.merging import check_files, load_ruleset
from faultwatch.rules.model import (
    DEFAULT_ACTIONS,
    POLICY_CHOICES,
    POLICY_KEYS,
    MatchBatch,
    ProgressMark,
    RankFailure,
    Rule,
    RuleSet,
    RuleTest,
    StageMark,
)
from faultwatch.rules.prefix import split_prefixed, strip_rank
from faultwatch.rules.selftest import run_rule_tests
from faultwatch.rules.torchrun import parse_child_failed

__all__ = [
    "BUILTIN_DIR", "DEFAULT_ACTIONS", "POLICY_CHOICES", "POLICY_KEYS",
    "MatchBatch", "Matcher", "ProgressMark", "RankFailure", "Rule", "RuleSet", "RuleTest",
    "StageMark", "builtin_paths", "check_files", "classify", "load_ruleset",
    "parse_child_failed", "pick_root", "run_rule_tests", "split_prefixed", "strip_rank",
]
