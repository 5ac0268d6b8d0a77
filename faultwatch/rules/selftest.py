"""Runs the inline `tests:` of every rule (`faultwatch rules test`)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from faultwatch.errors import RuleError, RuleProblem
from faultwatch.rules.engine import Matcher
from faultwatch.rules.merging import load_ruleset
from faultwatch.rules.model import RuleSet


def run_rule_tests(ruleset_or_paths: RuleSet | Sequence[str | Path]) -> list[RuleProblem]:
    """Every failing inline test, located at its test entry's path:line ([] when all pass)."""
    if isinstance(ruleset_or_paths, RuleSet):
        rs = ruleset_or_paths
    else:
        try:
            rs = load_ruleset(ruleset_or_paths)
        except RuleError as e:
            return e.problems
    matcher = Matcher(rs)
    problems: list[RuleProblem] = []
    for rule in rs.rules:
        for t in rule.tests:
            hits = {r.id: m for r, m in matcher.rules_matching(t.text)}
            hit = rule.id in hits
            if t.expect_match and not hit:
                problems.append(RuleProblem(rule.path, t.line, f"rule {rule.id!r} does not "
                                            f"match {t.text!r}", rule.id))
            elif not t.expect_match and hit:
                problems.append(RuleProblem(rule.path, t.line, f"rule {rule.id!r} matches "
                                            f"{t.text!r} (listed under no_match)", rule.id))
            elif hit and rule.kind in ("progress", "stage") \
                    and (t.step is not None or t.total is not None):
                m = hits[rule.id]
                gd = m.groupdict() if m is not True else {}
                step = int(gd["step"]) if gd.get("step") else None
                total = int(gd["total"]) if gd.get("total") else None
                if t.step is not None and step != t.step or (
                        t.total is not None and total != t.total):
                    problems.append(RuleProblem(
                        rule.path, t.line, f"rule {rule.id!r} on {t.text!r}: got step={step} "
                        f"total={total}, expected step={t.step} total={t.total}", rule.id))
    return problems
