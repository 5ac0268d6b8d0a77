"""The pure core (faultwatch.core, faultwatch.rules) imports no I/O, Kafka, Faust or torch,
and nothing of faultwatch above it; no faultwatch module imports in a cycle.

Both read every module's source with `ast` (imports inside functions and under
TYPE_CHECKING included), so a forbidden import anywhere in a module is found even if it is
never executed.
"""

from __future__ import annotations

import ast
import pkgutil
from collections.abc import Iterator
from pathlib import Path

import faultwatch

ROOT = Path(faultwatch.__file__).parent
PURE_PACKAGES = ("faultwatch.core", "faultwatch.rules", "faultwatch.diagnose")
# what the pure core may import from faultwatch besides itself (diagnose: the pure comparison
# of the ranks' stacks and Flight Recorder dumps, plain dicts in and out)
PURE_MAY_IMPORT = ("faultwatch.core", "faultwatch.rules", "faultwatch.diagnose",
                   "faultwatch.errors")
FORBIDDEN = {
    # Kafka, stream processing, ML
    "aiokafka", "kafka", "confluent_kafka", "faust", "mode", "torch", "numpy",
    # concurrency, processes, network and direct I/O: the shells do these, the core is given
    # data and time
    "asyncio", "threading", "multiprocessing", "concurrent", "subprocess", "socket",
    "selectors", "signal", "select", "ssl", "http", "urllib", "requests", "shutil", "tempfile",
    "sqlite3", "fcntl", "mmap", "pty", "time",
}
# rules/ loads rule files (the built-in set ships as package data): it may read files, yaml
# is its format, and it maps signal names to numbers (signal.Signals); the core may not
CORE_ONLY_FORBIDDEN = {"os", "pathlib", "io", "glob", "yaml", "importlib", "signal"}
FORBIDDEN -= {"signal"}
# Import cycles that exist in modules other work of issue 9 is replacing (one supervisor,
# the Faust shell as stages); each is one edge that closes a cycle. Empty this as they land:
# a new cycle anywhere else fails the test.
KNOWN_CYCLE_EDGES: set[tuple[str, str]] = set()  # none left: every cycle was removed


def module_files() -> dict[str, Path]:
    """Every module of the faultwatch package by dotted name."""
    out = {"faultwatch": ROOT / "__init__.py"}
    for info in pkgutil.walk_packages([str(ROOT)], prefix="faultwatch."):
        rel = info.name.split(".")[1:]
        base = ROOT.joinpath(*rel)
        out[info.name] = base / "__init__.py" if info.ispkg else base.with_suffix(".py")
    return out


def imports_of(name: str, path: Path) -> Iterator[tuple[str, int]]:
    """(imported module, line) for every import statement in the module, relative ones
    resolved; `from a import b` yields a.b when that is a module, else a."""
    tree = ast.parse(path.read_text(), str(path))
    pkg = name if path.name == "__init__.py" else name.rpartition(".")[0]
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for a in node.names:
                yield a.name, node.lineno
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = pkg.split(".")
                parts = parts[: len(parts) - node.level + 1]
                base = ".".join(parts + ([base] if base else []))
            for a in node.names:  # a.b when b is a module, else resolve() finds a
                yield f"{base}.{a.name}", node.lineno


def resolve(mod: str, known: dict[str, Path]) -> str | None:
    """The faultwatch module an import refers to (the longest known prefix), or None."""
    while mod:
        if mod in known:
            return mod
        mod = mod.rpartition(".")[0]
    return None


def _where(path: Path) -> str:
    return str(path.relative_to(ROOT.parent)) if path.is_relative_to(ROOT.parent) else str(path)


def pure_violations(files: dict[str, Path]) -> list[str]:
    bad = []
    for name, path in sorted(files.items()):
        if not name.startswith(PURE_PACKAGES):
            continue
        forbidden = FORBIDDEN | (CORE_ONLY_FORBIDDEN if name.startswith("faultwatch.core") else
                                 set())
        for mod, line in imports_of(name, path):
            top = mod.split(".")[0]
            if top in forbidden:
                bad.append(f"{_where(path)}:{line}: imports {mod}")
            elif top == "faultwatch":
                target = resolve(mod, files)
                if target is not None and not target.startswith(PURE_MAY_IMPORT) \
                        and target != "faultwatch":
                    bad.append(f"{_where(path)}:{line}: imports {target}")
    return sorted(set(bad))


def import_graph(files: dict[str, Path]) -> dict[str, set[str]]:
    graph: dict[str, set[str]] = {}
    for name, path in files.items():
        deps = set()
        for mod, _ in imports_of(name, path):
            target = resolve(mod, files)
            if target is not None and target != name and target != "faultwatch":
                deps.add(target)
        graph[name] = deps
    return graph


def graph_without_known_cycles(files: dict[str, Path]) -> dict[str, set[str]]:
    graph = import_graph(files)
    for a, b in KNOWN_CYCLE_EDGES:
        graph.get(a, set()).discard(b)
    return graph


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One import cycle (as a path a -> ... -> a), or None."""
    state: dict[str, int] = {}  # 1: on the stack, 2: done
    stack: list[str] = []

    def visit(n: str) -> list[str] | None:
        state[n] = 1
        stack.append(n)
        for m in sorted(graph.get(n, ())):
            if state.get(m) == 1:
                return stack[stack.index(m):] + [m]
            if m not in state:
                found = visit(m)
                if found:
                    return found
        stack.pop()
        state[n] = 2
        return None

    for n in sorted(graph):
        if n not in state:
            found = visit(n)
            if found:
                return found
    return None


def test_pure_core_imports_nothing_forbidden() -> None:
    files = module_files()
    pure = [n for n in files if n.startswith(PURE_PACKAGES)]
    assert "faultwatch.core.job" in pure and "faultwatch.rules.engine" in pure  # walked them
    assert pure_violations(files) == []


def test_the_check_catches_forbidden_imports(tmp_path: Path) -> None:
    """Positive control: the same check flags a forbidden import in a core module, even
    inside a function, and an import of a shell module."""
    mod = tmp_path / "failure.py"
    mod.write_text("def f():\n    import aiokafka\n\nfrom faultwatch import wire\n")
    files = {"faultwatch.core.failure": mod, "faultwatch.wire": ROOT / "wire" / "__init__.py"}
    assert pure_violations(files) == [f"{mod}:2: imports aiokafka",
                                      f"{mod}:4: imports faultwatch.wire"]


def test_no_faultwatch_module_imports_in_a_cycle() -> None:
    graph = graph_without_known_cycles(module_files())
    assert len(graph) > 40  # the whole package was walked
    assert find_cycle(graph) is None, " -> ".join(find_cycle(graph) or [])


def test_the_cycle_check_finds_a_cycle(tmp_path: Path) -> None:
    """Positive control: a back-import from a detector to job.py, even one only for type
    checking, is a cycle."""
    files = module_files()
    failure = tmp_path / "failure.py"
    failure.write_text(files["faultwatch.core.failure"].read_text()
                       + "\nif TYPE_CHECKING:\n    from faultwatch.core.job import apply\n")
    files["faultwatch.core.failure"] = failure
    cycle = find_cycle(graph_without_known_cycles(files))
    assert cycle is not None and cycle[0] == cycle[-1]
    assert {"faultwatch.core.job", "faultwatch.core.failure"} <= set(cycle)
