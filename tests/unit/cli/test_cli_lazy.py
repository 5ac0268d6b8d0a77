"""The CLI imports only the command it runs (issue 37): building the parser pulls in no
stream-processing or ML library, a command's parse imports no other command's module, and
the light table (cli/commands.py) says what the full tree says in `faultwatch --help`."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from faultwatch import cli
from faultwatch.cli import tree
from faultwatch.cli.commands import COMMANDS

HEAVY = ("faust", "aiokafka", "hyperscan", "torch")

PROBE = """
import json, sys
import faultwatch.cli
{action}
print(json.dumps(sorted(m for m in sys.modules
                        if m.split(".")[0] in {heavy!r} or m.startswith("faultwatch.cli."))))
"""


def _imported(action: str) -> list[str]:
    """The heavy libraries and CLI modules a fresh interpreter holds after `action`."""
    code = PROBE.format(action=action, heavy=HEAVY)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=120, check=True).stdout
    return list(json.loads(out))


def test_the_whole_tree_imports_no_processor_or_ml_library() -> None:
    mods = _imported("faultwatch.cli.build_parser()")
    assert not [m for m in mods if m.split(".")[0] in HEAVY], mods
    assert "faultwatch.cli.agent" in mods  # positive control: the full tree was built


def test_a_command_imports_its_own_module_and_no_other_commands() -> None:
    mods = _imported("faultwatch.cli.parse_args(['rules', 'classify', 'one.log'])")
    commands = {f"faultwatch.cli.{c.module}" for c in COMMANDS}
    assert set(mods) & commands == {"faultwatch.cli.rules"}, mods
    assert not [m for m in mods if m.split(".")[0] in HEAVY], mods


@pytest.mark.parametrize("first", ["--help", "--version", "stauts", ""])
def test_help_version_and_typos_need_no_command_module(first: str) -> None:
    mods = _imported(f"faultwatch.cli.tree.parser_for([{first!r}] if {first!r} else [])")
    assert not set(mods) & {f"faultwatch.cli.{c.module}" for c in COMMANDS}, mods


def test_the_light_table_says_what_the_full_tree_says() -> None:
    full, light = tree.build_parser(), tree.build_parser(())
    assert light.format_help() == full.format_help()
    assert tree.build_parser(("status",)).format_help() == full.format_help()


def test_completion_sees_the_whole_tree(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["completion", "bash"]) == 0
    script = capsys.readouterr().out
    assert "quarantine" in script and "classify" in script  # other commands' subcommands
