"""The package's own source, for the tests that hold a name, default or record to one owner:
where a string literal or a spelling occurs outside the module that owns it."""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[2] / "faultwatch"


def modules(root: Path = PACKAGE) -> Iterator[tuple[str, str]]:
    """(path relative to the package's parent, source) of every module under `root`."""
    for path in sorted(root.rglob("*.py")):
        yield str(path.relative_to(root.parent)), path.read_text()


def string_literals(source: str, unrelated: frozenset[str] = frozenset()
                    ) -> Iterator[tuple[int, str]]:
    """(line, value) of every string constant in `source` that is not a docstring; an
    f-string's literal parts count, so `f"{p}logs"` yields `logs`. Constants given to a
    keyword or assigned to a name in `unrelated` (e.g. `client_id`) are left out."""
    tree = ast.parse(source)
    skip = {id(n.body[0].value) for n in ast.walk(tree)
            if isinstance(n, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef)
            and n.body and isinstance(n.body[0], ast.Expr)
            and isinstance(n.body[0].value, ast.Constant)}
    for n in ast.walk(tree):
        if isinstance(n, ast.keyword) and n.arg in unrelated:
            skip |= {id(c) for c in ast.walk(n.value)}
        elif isinstance(n, ast.Assign) and any(isinstance(t, ast.Name) and t.id in unrelated
                                               for t in n.targets):
            skip |= {id(c) for c in ast.walk(n.value)}
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str) \
                and id(node) not in skip:
            yield node.lineno, node.value


def prefixed_fstrings(source: str) -> Iterator[tuple[int, str]]:
    """(line, text) of every f-string that starts with a value and goes on with text:
    `f"{prefix}logs"` yields `logs` (how a second owner builds a name under a prefix)."""
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.JoinedStr) and len(node.values) >= 2 \
                and isinstance(node.values[0], ast.FormattedValue) \
                and isinstance(node.values[1], ast.Constant):
            yield node.lineno, str(node.values[1].value)


def literal_hits(pattern: str, owners: set[str], root: Path = PACKAGE,
                 sources: Iterator[tuple[str, str]] | None = None, *,
                 after_prefix: bool = False, unrelated: frozenset[str] = frozenset()
                 ) -> list[str]:
    """`path:line: value` of every string literal matching the regular expression `pattern`
    in a module outside `owners` (paths as modules() gives them); `after_prefix`: of every
    f-string's text after a leading value instead (prefixed_fstrings)."""
    rx = re.compile(pattern)
    out = []
    for path, source in sources if sources is not None else modules(root):
        if path in owners:
            continue
        found = prefixed_fstrings(source) if after_prefix \
            else string_literals(source, unrelated)
        out += [f"{path}:{line}: {value!r}" for line, value in found if rx.search(value)]
    return out
