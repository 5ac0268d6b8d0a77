"""The docs hold together: every relative link of README, CONTRIBUTING, CHANGELOG and docs/
names a file that exists and, with a #fragment, a heading it has; the README stays a front
door (the demo and test commands at the top, short, its figures linked to docs/bench.md)."""

from __future__ import annotations

import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
PAGES = [REPO / "README.md", REPO / "CONTRIBUTING.md", REPO / "CHANGELOG.md",
         *sorted((REPO / "docs").glob("*.md"))]
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")


def slug(heading: str) -> str:
    """GitHub's anchor of a heading: lower case, punctuation dropped, spaces to hyphens."""
    text = re.sub(r"[`*_]|\[([^\]]*)\]\([^)]*\)", r"\1", heading.strip()).lower()
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def anchors(page: Path) -> set[str]:
    text = re.sub(r"```.*?```", "", page.read_text(), flags=re.S)
    return {slug(h) for h in re.findall(r"^#{1,6} (.+)$", text, re.M)}


def broken_links(pages: list[Path]) -> list[str]:
    bad = []
    for page in pages:
        text = re.sub(r"```.*?```|`[^`\n]*`", "", page.read_text(), flags=re.S)
        for target in LINK.findall(text):
            if re.match(r"[a-z]+:", target):  # http:, https:, mailto:
                continue
            path, _, frag = target.partition("#")
            dest = (page.parent / path).resolve() if path else page
            if not dest.exists():
                bad.append(f"{page.name}: {target}: no such file")
            elif frag and dest.suffix == ".md" and frag not in anchors(dest):
                bad.append(f"{page.name}: {target}: no such heading")
    return bad


def test_every_relative_link_resolves() -> None:
    assert len(PAGES) > 8
    assert broken_links(PAGES) == []


def test_the_link_check_sees_a_broken_file_and_heading(tmp_path: Path) -> None:
    """Positive control: a missing file and a missing heading are both reported."""
    (tmp_path / "a.md").write_text("# Title\n\n## The `run` command\n\n[x](b.md) [y](#nope) "
                                   "[z](#the-run-command) [w](https://example.com)\n")
    assert broken_links([tmp_path / "a.md"]) == ["a.md: b.md: no such file",
                                                 "a.md: #nope: no such heading"]


def test_readme_is_a_front_door() -> None:
    lines = (REPO / "README.md").read_text().splitlines()
    top = "\n".join(lines[:15])
    assert "scripts/demo.sh" in top and "scripts/test.sh" in top
    assert len(lines) < 160, "the README grows into a report again: move details to docs/"
    table = [line for line in lines if line.startswith("| [")]
    assert table and all("docs/bench.md#" in line for line in table), \
        "each headline figure links to its command and date in docs/bench.md"
