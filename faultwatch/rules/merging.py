"""Merges parsed rule files in order into one rule set: overrides, disables, the policy, the
version; loading and checking files over the built-in ones."""

from __future__ import annotations

import dataclasses
import hashlib
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from faultwatch.errors import RuleError, RuleProblem
from faultwatch.rules.loader import (
    PATTERN_KEYS,
    FileResult,
    builtin_results,
    parse_file,
    parse_text,
    suggest,
)
from faultwatch.rules.model import Rule, RuleSet


def merge_texts(files: Sequence[tuple[str, str]], *, builtin: bool = True
                ) -> tuple[RuleSet, list[RuleProblem]]:
    """(rule set, problems) of (name, text) pairs merged in order over the built-in files."""
    results = builtin_results() if builtin else []
    results += [parse_text(name, text) for name, text in files]
    return merge(results)


def _version(rules: Sequence[Rule], policy: dict[str, object],
             exceptions: dict[str, str] | None = None) -> str:
    content: dict[str, object] = {"rules": [r.fingerprint() for r in rules], "policy": policy}
    if exceptions:
        content["exceptions"] = exceptions
    blob = json.dumps(content, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(blob.encode()).hexdigest()[:12]


def where(res_path: str, line: int, layer: str) -> str:
    """A definition's place for people: `builtin nccl.yaml:40`, `files site.yaml:3`."""
    path = Path(res_path).name if layer == "builtin" else res_path
    return f"{layer + ' ' if layer else ''}{path}:{line}"


def _patterns(rule: Rule) -> list[str]:
    return [f"{k} {val!r}" for k in PATTERN_KEYS for val in getattr(rule, k)]


def _override(base: Rule, new: Rule, base_at: str, problems: list[RuleProblem]) -> Rule | None:
    """The rule in force when `new` has the id of `base` (an earlier file or layer), or None
    (and a problem) when the override would silently drop what `base` matches."""
    if new.override == "replace":
        return new
    if new.override == "merge":
        kind = new.kind if "kind" in new.given else base.kind
        if kind != base.kind:
            problems.append(RuleProblem(new.path, new.line, f"override: merge cannot change "
                                        f"kind {base.kind} (of {base_at}) to {kind}; use "
                                        "override: replace", new.id))
            return None
        changes: dict[str, Any] = {k: getattr(new, k) for k in new.given
                                   if k not in PATTERN_KEYS and k not in ("id", "kind", "tests")
                                   and hasattr(new, k)}
        for k in PATTERN_KEYS:  # patterns add up: the earlier ones keep matching
            old = getattr(base, k)
            changes[k] = tuple(dict.fromkeys((*old, *getattr(new, k))))
        return dataclasses.replace(base, **changes, kind=kind, tests=base.tests + new.tests,
                                   path=new.path, line=new.line, override="merge",
                                   given=new.given)
    dropped = [p for p in _patterns(base) if p not in _patterns(new)]
    if not dropped:
        return new
    shown = ", ".join(dropped[:3]) + (f" (+{len(dropped) - 3} more)" if len(dropped) > 3 else "")
    problems.append(RuleProblem(new.path, new.line, (
        f"rule {new.id!r} overrides {base_at} and would drop its patterns {shown}; add "
        "`override: merge` to keep them (the keys given here replace, patterns add up) or "
        "`override: replace` to drop them"), new.id))
    return None


def merge(results: Sequence[FileResult]) -> tuple[RuleSet, list[RuleProblem]]:
    """Merges parsed files in order: a later rule with an earlier rule's id overrides it (as
    its `override:` says; dropping the earlier rule's patterns must be said), disables
    remove. Each rule in force keeps where it was defined (`RuleSet.origins`)."""
    problems = [p for r in results for p in r.problems]
    rules: dict[str, Rule] = {}
    origins: dict[str, tuple[str, ...]] = {}
    policy: dict[str, object] = {}
    exceptions: dict[str, str] = {}
    for res in results:
        exceptions.update(res.exceptions)
        for rule in res.rules:
            at = where(res.path, rule.line, res.layer)
            base = rules.pop(rule.id, None)
            if base is None:
                if rule.override is not None:
                    problems.append(RuleProblem(res.path, rule.line, (
                        f"override: {rule.override}, but no earlier rule has id {rule.id!r}"
                        f"{suggest(rule.id, rules)}"), rule.id))
                    continue
                rules[rule.id] = rule
                origins[rule.id] = (at,)
                continue
            merged = _override(base, rule, origins[rule.id][-1], problems)
            rules[rule.id] = base if merged is None else merged
            if merged is not None:
                origins[rule.id] += (f"{at} {rule.override or 'replace'}",)
        for rid, line in res.disabled:
            if rules.pop(rid, None) is None and not any(rid == r.id for r in res.rules):
                problems.append(RuleProblem(res.path, line, f"disables unknown rule {rid!r}"
                                            f"{suggest(rid, rules)}", rid))
            origins.pop(rid, None)
        policy.update(res.policy)
    effective = tuple(rules.values())
    rs = RuleSet(effective, policy, _version(effective, policy, exceptions),
                 tuple(r.path for r in results), exceptions, origins)
    return rs, problems


def _all_results(paths: Sequence[str | Path], builtin: bool) -> list[FileResult]:
    return [*(builtin_results() if builtin else []), *(parse_file(p, "files") for p in paths)]


def load_ruleset(paths: Sequence[str | Path] = (), *, builtin: bool = True) -> RuleSet:
    """Loads the built-in files then `paths` in order; raises RuleError with every problem."""
    rs, problems = merge(_all_results(paths, builtin))
    if problems:
        raise RuleError(sorted(problems, key=lambda p: (p.path, p.line)))
    return rs


def check_files(paths: Sequence[str | Path], *, builtin: bool = True) -> list[RuleProblem]:
    """Every problem in the files (merged over the built-in set), without raising."""
    problems = merge(_all_results(paths, builtin))[1]
    return sorted(problems, key=lambda p: (p.path, p.line))
