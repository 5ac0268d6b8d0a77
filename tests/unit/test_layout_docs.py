"""README's layout table names every package and root module of faultwatch/, and the root holds
only packages plus the modules every layer uses."""

from __future__ import annotations

import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
PKG = REPO / "faultwatch"


def _layout_rows() -> str:
    text = (REPO / "README.md").read_text()
    start = text.index("## Layout")
    return text[start:text.index("\n## ", start + 1)]


def test_readme_layout_lists_every_package_and_root_module() -> None:
    rows = _layout_rows()
    named = set(re.findall(r"`(?:faultwatch/)?([\w.]+)/?`", rows))
    packages = {p.name for p in PKG.iterdir() if (p / "__init__.py").exists()}
    modules = {p.name for p in PKG.glob("*.py") if p.name not in ("__init__.py", "__main__.py")}
    assert packages and modules
    assert sorted(packages - named) == [], "packages missing from README's layout table"
    assert sorted(modules - named) == [], "root modules missing from README's layout table"
