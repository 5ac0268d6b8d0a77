"""Checks on single values of a rule file: ids, patterns (syntax, backtracking), signals, policy."""

from __future__ import annotations

import functools
import re
import re._constants as sre_c
import re._parser as sre_parse
import signal as _signal
from typing import Any

import regex

ID_RE = re.compile(r"[a-z0-9][a-z0-9_.-]*\Z")
EXC_NAME_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,99}(?:\.[A-Za-z_][A-Za-z0-9_]{0,99}){0,9}\Z")
MAX_PATTERN_LEN = 2000
MAX_FILE_BYTES = 1 << 20
MAX_RULES_PER_FILE = 2000
REGEX_TIMEOUT_S = 0.05
MAX_YAML_DEPTH = 64
MAX_YAML_NODES = 200_000

_REPEATS = {sre_c.MAX_REPEAT, sre_c.MIN_REPEAT, getattr(sre_c, "POSSESSIVE_REPEAT", None)}
_UNBOUNDED = sre_c.MAXREPEAT


def compile_error(pattern: str) -> str | None:
    """None if the pattern compiles with the `regex` module, else a message with the column."""
    if len(pattern) > MAX_PATTERN_LEN:
        return f"pattern is {len(pattern)} characters long, the limit is {MAX_PATTERN_LEN}"
    try:
        compiled = regex.compile(pattern)
    except regex.error as e:
        pos = getattr(e, "pos", None)
        where = f" at column {pos + 1}" if isinstance(pos, int) else ""
        msg = str(e).split(" at position")[0]
        return f"invalid regex{where}: {msg} (pattern {pattern!r})"
    if compiled.search("") is not None:
        return f"pattern {pattern!r} matches the empty string (it would match every line)"
    return None


def _has_repeat(items: Any, variable_only: bool) -> bool:
    for op, av in items:
        if op in _REPEATS:
            lo, hi, sub = av
            if not variable_only or hi > 1 and hi != lo:
                return True
            if _has_repeat(sub, variable_only):
                return True
        elif op is sre_c.SUBPATTERN:
            if _has_repeat(av[-1], variable_only):
                return True
        elif op is sre_c.BRANCH:
            if any(_has_repeat(b, variable_only) for b in av[1]):
                return True
        elif op in (sre_c.ASSERT, sre_c.ASSERT_NOT):
            if _has_repeat(av[1], variable_only):
                return True
        elif op is getattr(sre_c, "ATOMIC_GROUP", None):
            if _has_repeat(av, variable_only):
                return True
    return False


_CATS = {
    sre_c.CATEGORY_DIGIT: str.isdigit, sre_c.CATEGORY_WORD: lambda c: c.isalnum() or c == "_",
    sre_c.CATEGORY_SPACE: str.isspace,
}
_NOT_CATS = {
    sre_c.CATEGORY_NOT_DIGIT: sre_c.CATEGORY_DIGIT, sre_c.CATEGORY_NOT_WORD: sre_c.CATEGORY_WORD,
    sre_c.CATEGORY_NOT_SPACE: sre_c.CATEGORY_SPACE,
}


def _item_can_match(op: Any, av: Any, ch: str) -> bool:
    """Whether one single-character item can consume ch (conservative: True if unsure)."""
    if op is sre_c.LITERAL:
        return chr(av) == ch
    if op is sre_c.NOT_LITERAL:
        return chr(av) != ch
    if op is sre_c.ANY:
        return ch != "\n"
    if op is sre_c.IN:
        negate, hit = False, False
        for iop, iav in av:
            if iop is sre_c.NEGATE:
                negate = True
            elif iop is sre_c.LITERAL:
                hit = hit or chr(iav) == ch
            elif iop is sre_c.RANGE:
                hit = hit or iav[0] <= ord(ch) <= iav[1]
            elif iop is sre_c.CATEGORY and iav in _CATS:
                hit = hit or _CATS[iav](ch)
            elif iop is sre_c.CATEGORY and iav in _NOT_CATS:
                hit = hit or not _CATS[_NOT_CATS[iav]](ch)
            else:
                return True
        return hit != negate
    return True


def _repeats_can_match(items: Any, ch: str) -> bool:
    """Whether any variable repeat inside items can consume ch."""
    for op, av in items:
        if op in _REPEATS:
            sub = av[2]
            if len(sub) == 1 and sub[0][0] in (sre_c.LITERAL, sre_c.NOT_LITERAL, sre_c.ANY,
                                               sre_c.IN):
                if _item_can_match(sub[0][0], sub[0][1], ch):
                    return True
            else:
                return True
        elif op is sre_c.SUBPATTERN or op is sre_c.BRANCH:
            return True
    return False


def _separated(sub: Any) -> bool:
    """The repeated body has a mandatory literal that its inner repeats cannot consume."""
    return any(op is sre_c.LITERAL and not _repeats_can_match(sub, chr(av)) for op, av in sub)


def _nested_unbounded(items: Any) -> bool:
    for op, av in items:
        if op in _REPEATS:
            lo, hi, sub = av
            body = sub
            if len(sub) == 1 and sub[0][0] is sre_c.SUBPATTERN:
                body = sub[0][1][-1]
            if (hi == _UNBOUNDED and hi != lo and _has_repeat(sub, True)
                    and not _separated(body)):
                return True
            if _nested_unbounded(sub):
                return True
        elif op is sre_c.SUBPATTERN:
            if _nested_unbounded(av[-1]):
                return True
        elif op is sre_c.BRANCH:
            if any(_nested_unbounded(b) for b in av[1]):
                return True
        elif op in (sre_c.ASSERT, sre_c.ASSERT_NOT):
            if _nested_unbounded(av[1]):
                return True
    return False


@functools.lru_cache(maxsize=1024)
def _parsed(pattern: str) -> Any:
    """The pattern's parse tree, read (never changed) by both checks below: parsed once."""
    return sre_parse.parse(pattern)


def backtracking_error(pattern: str) -> str | None:
    """A message when the pattern nests variable quantifiers, like (a+)+ or (\\w+\\s?)*."""
    try:
        parsed = _parsed(pattern)
    except Exception:  # regex-module-only syntax: the matcher's timeout still bounds it
        return None
    if _nested_unbounded(parsed):
        return (f"pattern {pattern!r} nests a variable quantifier inside an unbounded one "
                "(like (a+)+ or (\\w+\\s?)*), which can backtrack catastrophically; "
                "rewrite it without the outer repeat or bound it, e.g. {0,20}")
    return None


MAX_REPEAT_COST = 5000


def _cost(items: Any) -> int:
    """Characters the pattern's counted repeats can spell out (the states an automaton needs)."""
    total = 0
    for op, av in items:
        if op in _REPEATS:
            lo, hi, sub = av
            n = lo + 1 if hi == _UNBOUNDED else max(hi, 1)
            total += n * max(1, _cost(sub))
        elif op is sre_c.SUBPATTERN:
            total += _cost(av[-1])
        elif op is sre_c.BRANCH:
            total += sum(_cost(b) for b in av[1])
        elif op in (sre_c.ASSERT, sre_c.ASSERT_NOT):
            total += _cost(av[1])
        elif op is getattr(sre_c, "ATOMIC_GROUP", None):
            total += _cost(av)
        else:
            total += 1
    return total


def repeat_cost_error(pattern: str) -> str | None:
    """A message when counted repeats multiply out past MAX_REPEAT_COST, like (a{1,200}){100}:
    the linear-time engines compile them into huge automata (slow to build, slow to scan)."""
    try:
        parsed = _parsed(pattern)
    except Exception:  # regex-module-only syntax: patterns.fast_engine_errors decides
        return None
    cost = _cost(parsed)
    if cost > MAX_REPEAT_COST:
        return (f"pattern {pattern!r} has counted repeats that multiply out to {cost} "
                f"positions (limit {MAX_REPEAT_COST}); use smaller bounds or separate rules")
    return None


def named_groups(pattern: str) -> set[str]:
    """The named groups of a pattern that compiles."""
    return set(regex.compile(pattern).groupindex)


def signal_number(value: object) -> int | None:
    """A signal given as a number or a name like SIGKILL / KILL; None if unknown."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value if 0 < value < 128 else None
    if isinstance(value, str):
        name = value.strip().upper()
        if not name.startswith("SIG"):
            name = "SIG" + name
        try:
            return int(_signal.Signals[name])
        except KeyError:
            return None
    return None


def policy_value_error(key: str, value: object) -> str | None:
    """None if the value is valid for the policy key, else why not (core/policy.value_error:
    the one check; a string is compared lower-cased, as the loader keeps it)."""
    from faultwatch.core.policy import value_error

    why = value_error(key, value.lower() if isinstance(value, str) else value)
    if why is None:
        return None
    where = " (the documented range, docs/rules.md)" if why.startswith("must be in") else ""
    return f"policy.{key} {why}{where}"
