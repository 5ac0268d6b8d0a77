"""The layout's guards, each shown to fail on a planted violation:

- every module that claims to be pure (the core, the rules, the diagnosis, the node gate and
  the boot-check judge, notification grouping, the actuator's plan) imports no I/O, Kafka,
  Faust or torch, and nothing of faultwatch that is not pure itself;
- no faultwatch module imports one on a floor above its own (LAYERS), and none in a cycle.

All read every module's source with `ast` (imports inside functions and under
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
PURE_PACKAGES = ("faultwatch.core", "faultwatch.rules", "faultwatch.dumps",
                 "faultwatch.launch")
# pure modules of the operating services: the job stage's node gate and the boot-check judge
# it uses, notification grouping, the actuator's plan and the scheduler-name patterns; of the
# readers: the merge across partitions, the filters, the timeline and the column fitting
PURE_MODULES = ("faultwatch.registry.gate", "faultwatch.registry.checks",
                "faultwatch.registry.names",
                "faultwatch.notify.grouping", "faultwatch.actuate.plan",
                "faultwatch.readers.merge", "faultwatch.readers.select",
                "faultwatch.readers.timeline", "faultwatch.readers.columns")
# what a pure module may import from faultwatch besides pure modules (diagnose: the pure
# comparison of the ranks' stacks and Flight Recorder dumps, plain dicts in and out); the
# declarations of the environment variables (a pure module passes its env mapping in)
PURE_MAY_IMPORT = ("faultwatch.errors", "faultwatch.settings")
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
# is its format, and it maps signal names to numbers (signal.Signals); the others may not
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
        if not info.ispkg and not base.with_suffix(".py").exists():
            continue  # a built native module (rules/_native: Rust), it imports no module
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


def is_pure(name: str) -> bool:
    return name in PURE_MODULES or any(name == p or name.startswith(p + ".")
                                       for p in PURE_PACKAGES)


def pure_violations(files: dict[str, Path]) -> list[str]:
    bad = []
    for name, path in sorted(files.items()):
        if not is_pure(name):
            continue
        reads_files = name.startswith(("faultwatch.rules", "faultwatch.dumps"))
        forbidden = FORBIDDEN | (set() if reads_files else CORE_ONLY_FORBIDDEN)
        for mod, line in imports_of(name, path):
            top = mod.split(".")[0]
            if top in forbidden:
                bad.append(f"{_where(path)}:{line}: imports {mod}")
            elif top == "faultwatch":
                target = resolve(mod, files)
                if target is not None and not is_pure(target) \
                        and not target.startswith(PURE_MAY_IMPORT) and target != "faultwatch":
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
    pure = [n for n in files if is_pure(n)]
    assert "faultwatch.core.job" in pure and "faultwatch.rules.engine" in pure  # walked them
    assert "faultwatch.core.registry" in pure
    assert set(PURE_MODULES) <= set(pure)  # every claimed module exists and was walked
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


def test_the_check_covers_every_module_that_claims_purity(tmp_path: Path) -> None:
    """Positive control for the pure modules beside the core: the clock in the node gate, a
    printing helper in the boot-check judge and an import of the event log in notification
    grouping are each found."""
    files = module_files()
    planted = {"faultwatch.registry.gate": "import time\n",
               "faultwatch.registry.checks": "from faultwatch.readers.render import render_line\n",
               "faultwatch.notify.grouping":
                   "def f():\n    from faultwatch.eventlog import log_event\n"}
    for name, text in planted.items():
        copy = tmp_path / f"{name}.py"
        copy.write_text(files[name].read_text() + text)
        files[name] = copy
    found = {v.split(":")[0] for v in pure_violations(files)}
    assert found == {str(tmp_path / f"{name}.py") for name in planted}


# The floors of the package, top to bottom. A module may import modules on its own floor or
# below, never above: the command line wires everything; the stream processor and the
# actuator run on the node side's and the services' parts; those reach Kafka through kafka/,
# which speaks the wire contracts; the contracts and the rules are made of the pure core;
# at the bottom the SDK, the diagnosis and what every layer uses. A module the floors do not
# place fails the test (say where a new package belongs).
LAYERS: tuple[tuple[str, ...], ...] = (
    ("faultwatch.cli", "faultwatch.__main__", "*.cli"),
    ("faultwatch.streams", "faultwatch.actuate", "faultwatch.readers", "faultwatch.rollout"),
    ("faultwatch.agents", "faultwatch.notify", "faultwatch.registry", "faultwatch.holds",
     "faultwatch.integrations"),
    ("faultwatch.kafka", "faultwatch.trust"),
    ("faultwatch.wire", "faultwatch.rules"),
    ("faultwatch.eventlog", "faultwatch.quiet"),
    ("faultwatch.core",),
    ("faultwatch.sdk", "faultwatch.dumps", "faultwatch.errors", "faultwatch.metrics",
     "faultwatch.launch", "faultwatch.settings"),
)
# Upward imports that exist in modules other work is moving; each is one edge. Empty now
# that the command modules live in cli/: a new upward import anywhere fails.
KNOWN_UPWARD: set[tuple[str, str]] = set()


def floor_of(name: str) -> int | None:
    """The floor (0 = top) of a module: a command module (`*.cli`) is on the top floor,
    anything else where its longest listed prefix is."""
    if name.endswith(".cli") or ".cli." in name:
        return 0
    best: tuple[int, int] | None = None
    for floor, prefixes in enumerate(LAYERS):
        for p in prefixes:
            if (name == p or name.startswith(p + ".")) and (best is None or len(p) > best[0]):
                best = (len(p), floor)
    return None if best is None else best[1]


def layer_violations(files: dict[str, Path]) -> list[str]:
    bad = []
    for name, path in sorted(files.items()):
        if name == "faultwatch":
            continue
        floor = floor_of(name)
        if floor is None:
            bad.append(f"{_where(path)}: {name} is on no floor of LAYERS")
            continue
        for mod, line in imports_of(name, path):
            target = resolve(mod, files)
            if target is None or target in (name, "faultwatch") \
                    or (name, target) in KNOWN_UPWARD:
                continue
            up = floor_of(target)
            if up is not None and up < floor:
                bad.append(f"{_where(path)}:{line}: {name} (floor {floor}) imports {target} "
                           f"(floor {up}, above)")
    return sorted(set(bad))


def test_no_module_imports_from_a_floor_above_its_own() -> None:
    files = module_files()
    assert {"faultwatch.wire.signals", "faultwatch.kafka.clients"} <= set(files)
    assert layer_violations(files) == []


def test_the_layer_check_finds_an_upward_import_and_an_unplaced_module(tmp_path: Path) -> None:
    """Positive control: the wire contracts importing the Kafka client factory (one floor up,
    inside a function), the core importing the event log, and a module no floor places."""
    files = module_files()
    check = tmp_path / "_check.py"
    check.write_text(files["faultwatch.wire._check"].read_text()
                     + "\ndef f():\n    from faultwatch.kafka import clients\n")
    files["faultwatch.wire._check"] = check
    state = tmp_path / "state.py"
    state.write_text(files["faultwatch.core.state"].read_text()
                     + "\nfrom faultwatch.eventlog import log_event\n")
    files["faultwatch.core.state"] = state
    files["faultwatch.newthing"] = tmp_path / "newthing.py"
    files["faultwatch.newthing"].write_text("")
    bad = layer_violations(files)
    assert len(bad) == 3, bad
    text = "\n".join(bad)
    assert "faultwatch.wire._check (floor 4) imports faultwatch.kafka.clients (floor 3" in text
    assert "faultwatch.core.state (floor 6) imports faultwatch.eventlog (floor 5" in text
    assert "faultwatch.newthing is on no floor" in text


def test_the_known_upward_imports_still_exist() -> None:
    """An exception that is no longer needed is removed (it would hide a new one)."""
    graph = import_graph(module_files())
    assert [e for e in KNOWN_UPWARD if e[1] not in graph.get(e[0], set())] == []


MAX_MODULE_LINES = 600  # no module may pass it (issue 38 item 10): split it first


def long_modules(root: Path, limit: int = MAX_MODULE_LINES) -> list[str]:
    """Modules under `root` longer than `limit` lines, as paths relative to it."""
    return sorted(p.relative_to(root).as_posix() for p in root.rglob("*.py")
                  if len(p.read_text().splitlines()) > limit)


def test_no_module_passes_600_lines() -> None:
    assert long_modules(ROOT) == []


def test_the_length_check_finds_a_long_module(tmp_path: Path) -> None:
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "long.py").write_text("x = 1\n" * 601)
    (tmp_path / "pkg" / "short.py").write_text("x = 1\n" * 600)
    assert long_modules(tmp_path) == ["pkg/long.py"]
