"""The docs say what the code does: rules.md's policy table, the SDK's names, references."""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

import pytest

from faultwatch import sdk
from faultwatch.core.policy import Policy
from faultwatch.rules import POLICY_KEYS

REPO = Path(__file__).resolve().parents[3]


def _policy_table() -> dict[str, str]:
    """key -> default cell of the `policy:` table in docs/rules.md."""
    text = (REPO / "docs" / "rules.md").read_text()
    section = text[text.index("## Policy section"):]
    rows = re.findall(r"^\| `(\w+)` \|.*\| ([^|]+) \|$", section, re.M)
    return {k: v.strip() for k, v in rows}


def _documented(cell: str) -> object:
    if cell.startswith("unset"):
        return None
    if cell in ("true", "false"):
        return cell == "true"
    if cell == "[]":
        return ()
    m = re.match(r"^-?\d+(\.\d+)?", cell)
    return float(m.group(0)) if m else cell


def test_rules_md_lists_every_policy_key() -> None:
    assert set(_policy_table()) == set(POLICY_KEYS)


@pytest.mark.parametrize("field", [f.name for f in dataclasses.fields(Policy)])
def test_rules_md_policy_default_is_the_code_default(field: str) -> None:
    table = _policy_table()
    if field not in table:
        pytest.fail(f"docs/rules.md has no row for policy key {field}")
    code = getattr(Policy(), field)
    doc = _documented(table[field])
    if isinstance(code, bool) or code is None or isinstance(code, str | tuple):
        assert doc == code, (field, table[field])
    else:
        assert doc == float(code), (field, table[field])


def test_docs_name_sdk_functions_that_exist() -> None:
    names = set()
    for path in [*REPO.glob("docs/*.md"), REPO / "README.md", *REPO.glob("examples/*.py")]:
        names |= set(re.findall(r"\bsdk\.(\w+)\(", path.read_text()))
    for path in [*REPO.glob("docs/*.md"), *REPO.glob("faultwatch/**/*.py")]:
        assert "send_custom_message" not in path.read_text(), path
    assert names, "no sdk.X( mention found: the check would pass on nothing"
    assert sorted(n for n in names if not hasattr(sdk, n)) == []


def test_no_reference_to_a_file_the_repo_does_not_have() -> None:
    for path in REPO.glob("faultwatch/**/*.py"):
        for ref in re.findall(r"\b([A-Z][A-Z_]+\.md)\b", path.read_text()):
            assert (REPO / ref).exists(), f"{path}: refers to {ref}, not in the repo"
