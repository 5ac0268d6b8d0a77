"""CONTRIBUTING.md's layout table names every package and root module of faultwatch/, and the
root holds only packages plus the modules every layer uses."""

from __future__ import annotations

import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
PKG = REPO / "faultwatch"


def _layout_rows() -> str:
    text = (REPO / "CONTRIBUTING.md").read_text()
    start = text.index("## Layout")
    return text[start:text.index("\n## ", start + 1)]


def test_readme_layout_lists_every_package_and_root_module() -> None:
    rows = _layout_rows()
    named = set(re.findall(r"`(?:faultwatch/)?([\w.]+)/?`", rows))
    packages = {p.name for p in PKG.iterdir() if (p / "__init__.py").exists()}
    modules = {p.name for p in PKG.glob("*.py") if p.name not in ("__init__.py", "__main__.py")}
    assert packages and modules
    assert sorted(packages - named) == [], "packages missing from CONTRIBUTING.md's layout table"
    assert sorted(modules - named) == [], "root modules missing from CONTRIBUTING.md's layout table"


# ---- the CLI is the top floor: nothing below imports it ------------------------------------

def _imports(path: Path) -> set[str]:
    """Every faultwatch module `path` imports (also inside functions and TYPE_CHECKING)."""
    import ast

    out: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            out |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            out.add(node.module)
            out |= {f"{node.module}.{a.name}" for a in node.names}
    return {m for m in out if m.startswith("faultwatch")}


def _upward(root: Path) -> list[str]:
    """Modules outside cli/ importing faultwatch.cli, and processor or agent modules
    importing the command-line or reader layers."""
    bad = []
    for path in sorted(root.rglob("*.py")):
        rel = path.relative_to(root).as_posix()
        if rel.startswith("cli/") or rel == "__main__.py":
            continue
        above = ("faultwatch.cli",) if not rel.startswith(("streams/", "agents/", "core/")) \
            else ("faultwatch.cli", "faultwatch.readers")
        bad += [f"{rel} imports {m}" for m in sorted(_imports(path)) if m.startswith(above)]
    return bad


def test_nothing_below_the_cli_imports_it() -> None:
    assert _upward(PKG) == []


def test_the_layer_check_sees_an_upward_import(tmp_path: Path) -> None:
    """Positive control: the processor importing a command module (as status_publish once
    imported the `status` command) is caught, even inside a function."""
    (tmp_path / "streams").mkdir()
    (tmp_path / "streams" / "x.py").write_text("def f():\n    from faultwatch.cli import run\n")
    (tmp_path / "agents").mkdir()
    (tmp_path / "agents" / "y.py").write_text("import faultwatch.readers.status\n")
    assert _upward(tmp_path) == ["agents/y.py imports faultwatch.readers.status",
                                 "streams/x.py imports faultwatch.cli",
                                 "streams/x.py imports faultwatch.cli.run"]


# ---- the three sides: the node side never reaches into the processor or operator sides -----

NODE_SIDE = ("agents", "sdk", "integrations", "launch")
OTHER_SIDES = ("faultwatch.streams", "faultwatch.readers", "faultwatch.registry",
               "faultwatch.holds", "faultwatch.actuate", "faultwatch.notify", "faultwatch.cli")


def _reaching(root: Path) -> list[str]:
    """Node-side modules importing a processor- or operator-side package (also inside
    functions): what runs beside the training job carries no processor or operator code."""
    bad = []
    for side in NODE_SIDE:
        for path in sorted((root / side).rglob("*.py")):
            rel = path.relative_to(root).as_posix()
            bad += [f"{rel} imports {m}" for m in sorted(_imports(path))
                    if m.startswith(OTHER_SIDES)]
    return bad


def test_the_node_side_imports_nothing_of_the_processor_or_operator_sides() -> None:
    assert _reaching(PKG) == []
    # and the table groups every package under one side, in data-flow order
    rows = _layout_rows()
    heads = [h for h in ("**node side**", "**between the sides**", "**processor side**",
                         "**operator side**") if h in rows]
    assert heads == sorted(heads, key=rows.index) and len(heads) == 4


def test_the_side_check_sees_a_node_module_reaching_over(tmp_path: Path) -> None:
    (tmp_path / "agents").mkdir()
    (tmp_path / "agents" / "x.py").write_text(
        "def f():\n    from faultwatch.streams import local\n")
    for side in NODE_SIDE[1:]:
        (tmp_path / side).mkdir()
    assert _reaching(tmp_path) == ["agents/x.py imports faultwatch.streams",
                                   "agents/x.py imports faultwatch.streams.local"]
