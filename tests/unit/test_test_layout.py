"""The tests' own layout: shared helpers live in tests/support, no module under tests/ imports
from a test module, and waiting for an event goes through tests/support/waiting.py.

Each check runs over the real tree and over a planted bad example (its positive control).
"""

from __future__ import annotations

import ast
from pathlib import Path

TESTS = Path(__file__).resolve().parents[1]
ROOT = TESTS.parent
WAITING = TESTS / "support" / "waiting.py"

# Loops that sleep but do not wait for an event of a test: (file, function) -> why.
NOT_A_WAIT = {
    ("tests/integration/test_kafka_acls.py", "_watch_argv"):
        "a sampler thread: collects every command line until told to stop",
    ("tests/integration/test_processor_stop.py", "produce_jobs"):
        "paces a producer at a fixed rate",
    ("tests/support/goodput_truth.py", "_run"):
        "a sampler thread: notes when each command exits until told to stop",
}


def _module_name(path: Path) -> str:
    return ".".join(path.relative_to(ROOT).with_suffix("").parts)


def _is_test_module(dotted: str) -> bool:
    return dotted.rsplit(".", 1)[-1].startswith("test_")


def imported_test_modules(source: str, module: str) -> list[str]:
    """The test modules `source` (the module named `module`) imports, as dotted names."""
    package = module.rsplit(".", 1)[0]
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found += [a.name for a in node.names
                      if any(part.startswith("test_") for part in a.name.split("."))]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:  # relative: resolve against the importing module's package
                parts = package.split(".")
                anchor = ".".join(parts[:len(parts) - node.level + 1])
                base = f"{anchor}.{base}" if base else anchor
            if any(part.startswith("test_") for part in base.split(".")):
                found.append(base)
            else:  # `from tests.unit.core import test_detectors`
                found += [f"{base}.{a.name}" for a in node.names if _is_test_module(a.name)]
    return found



def _sleeping_loops(source: str) -> list[tuple[str, int]]:
    """(enclosing function, line) of each loop that sleeps and stops on a condition: a
    home-made poll loop (a `while`, or a loop with a `break`/`return`)."""
    out = []

    def visit(node: ast.AST, func: str) -> None:
        for child in ast.iter_child_nodes(node):
            name = child.name if isinstance(child, (ast.FunctionDef,
                                                    ast.AsyncFunctionDef)) else func
            if isinstance(child, (ast.While, ast.For, ast.AsyncFor)):
                inner = list(ast.walk(child))
                sleeps = any(isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute)
                             and n.func.attr in ("sleep", "wait") for n in inner)
                stops = any(isinstance(n, (ast.Break, ast.Return)) for n in inner)
                if sleeps and (stops or isinstance(child, ast.While)):
                    out.append((func, child.lineno))
                    continue
            visit(child, name)

    visit(ast.parse(source), "<module>")
    return out


def _test_sources() -> list[Path]:
    # tests/e2e/jobs holds the training jobs the e2e tests run, not test code
    return [p for p in sorted(TESTS.rglob("*.py")) if "jobs" not in p.relative_to(TESTS).parts]


def test_no_module_under_tests_imports_from_a_test_module() -> None:
    bad = [f"{p.relative_to(ROOT)} imports {m}" for p in _test_sources()
           for m in imported_test_modules(p.read_text(), _module_name(p))]
    assert not bad, ("shared helpers belong in tests/support (or a conftest fixture), never "
                     "in a test module:\n  " + "\n  ".join(bad))


def test_the_import_check_catches_every_spelling() -> None:
    planted = ("from tests.integration.test_agent_ship import agent_cmd\n"
               "from tests.unit.core import test_detectors as td\n"
               "import tests.e2e.test_slurm\n"
               "from .test_stages import helper\n"
               "from . import test_gate\n"
               "from tests.support.agents import agent_cmd\n"  # fine: a support module
               "from tests.unit.trust import helpers\n")     # fine: not a test module
    assert imported_test_modules(planted, "tests.unit.streams.test_x") == [
        "tests.integration.test_agent_ship", "tests.unit.core.test_detectors",
        "tests.e2e.test_slurm", "tests.unit.streams.test_stages", "tests.unit.streams.test_gate"]


def test_waiting_goes_through_wait_until() -> None:
    bad = []
    for p in _test_sources():
        if p == WAITING:
            continue
        rel = p.relative_to(ROOT).as_posix()
        bad += [f"{rel}:{line} in {func}" for func, line in _sleeping_loops(p.read_text())
                if (rel, func) not in NOT_A_WAIT]
    assert not bad, ("a home-made poll loop: use tests.support.waiting.wait_until (what is "
                     "awaited, the last value seen):\n  " + "\n  ".join(bad))
    listed = {(rel, func) for p in _test_sources()
              for rel in [p.relative_to(ROOT).as_posix()]
              for func, _ in _sleeping_loops(p.read_text())}
    assert set(NOT_A_WAIT) <= listed, f"stale exemptions: {set(NOT_A_WAIT) - listed}"


def test_the_poll_loop_check_catches_a_planted_loop() -> None:
    planted = ("import time\n"
               "def wait_for_file(path):\n"
               "    for _ in range(100):\n"
               "        if path.exists():\n"
               "            break\n"
               "        time.sleep(0.1)\n"
               "async def later(q):\n"
               "    while q.empty():\n"
               "        await asyncio.sleep(0.1)\n"
               "def paced(p):\n"
               "    for v in range(3):\n"
               "        time.sleep(0.1)\n")  # fine: no condition ends it
    assert _sleeping_loops(planted) == [("wait_for_file", 3), ("later", 8)]
    assert _sleeping_loops(WAITING.read_text())  # the one helper really is such a loop


PACKAGES = sorted(p.name for p in (ROOT / "faultwatch").iterdir()
                  if (p / "__init__.py").exists())
# loose tests named after a package that check the whole tree: name -> why
TREE_WIDE = {"test_core_is_pure.py": "the layout's guards over every package (arrows, cycles)"}


def misplaced_unit_tests(names: list[str], packages: list[str]) -> list[str]:
    """Loose tests/unit files named after a package of faultwatch/ (test_<package>[_...]):
    they belong in tests/unit/<package>/, which mirrors the package."""
    return [n for n in names for p in packages
            if n == f"test_{p}.py" or n.startswith(f"test_{p}_")]


def test_unit_tests_of_a_package_live_in_its_folder() -> None:
    loose = sorted(p.name for p in (TESTS / "unit").glob("test_*.py")
                   if p.name not in TREE_WIDE)
    assert misplaced_unit_tests(loose, PACKAGES) == []
    # the folders exist for the packages the issue named, each a package of its own
    for pkg in ("wire", "cli", "notify"):
        assert (TESTS / "unit" / pkg / "__init__.py").exists(), pkg


def test_the_unit_layout_check_catches_a_loose_package_test() -> None:
    assert misplaced_unit_tests(["test_wire_progress.py", "test_cli.py", "test_metrics.py",
                                 "test_wireless.py"], PACKAGES) == [
        "test_wire_progress.py", "test_cli.py"]
