"""The one CLI tree: every subcommand parses, `--` separates the wrapped command, every error
class maps to its exit code, and docs/cli.md's exit-code table says the same."""

from __future__ import annotations

import argparse
import re
from pathlib import Path
from typing import Any

import pytest

from faultwatch import cli, errors
from faultwatch.agents.config import (
    EXIT_BLACKLISTED,
    EXIT_BOOTCHECK_FAILED,
    EXIT_FAILED_BY_DECISION,
)
from faultwatch.agents.exitcodes import VERDICTS
from faultwatch.cli import agent as agent_cli
from faultwatch.cli import options
from faultwatch.cli import rules as rules_cli
from faultwatch.cli import run as run_cli
from faultwatch.errors import (
    EXIT_BROKER,
    EXIT_CHILD_NOT_STARTED,
    EXIT_DECODE,
    EXIT_ERROR,
    EXIT_INTERRUPTED,
    EXIT_MISSING_EXTRA,
    EXIT_RULES,
    EXIT_USAGE,
    FaultwatchError,
)

DOCS = Path(__file__).resolve().parents[3] / "docs" / "cli.md"

# One line of each command; each must parse to its own function.
EVERY_COMMAND: list[tuple[list[str], str]] = [
    (["run", "--max-restarts", "1", "--rules", "r.yaml", "--", "python", "t.py"], "cmd_run"),
    (["agent", "--job", "j", "--bootstrap", "b:1", "--", "torchrun", "t.py"], "cmd_agent"),
    (["agent", "--job", "j", "--flush"], "cmd_agent"),
    (["check", "--strict", "--json", "--", "torchrun", "t.py"], "cmd_check"),
    (["agent", "tail", "--job", "j", "x.log"], "cmd_agent_tail"),
    (["agent", "bootcheck", "--job", "j", "--no-ship"], "cmd_agent_bootcheck"),
    (["process", "--bootstrap", "b:1", "--settle-s", "1", "--rules", "r.yaml"], "cmd_process"),
    (["decisions", "--job", "j", "--json", "-f"], "cmd_decisions"),
    (["logs", "j", "--json"], "cmd_logs"),
    (["rules", "check", "a.yaml", "b.yaml"], "cmd_rules_check"),
    (["rules", "test"], "cmd_rules_test"),
    (["rules", "classify", "--exit-code", "1", "crash.log"], "cmd_rules_classify"),
    (["rules", "push", "a.yaml", "--bootstrap", "b:1"], "cmd_rules_push"),
    (["rules", "history", "--json"], "cmd_rules_history"),
    (["rules", "rollback", "--to-revision", "3"], "cmd_rules_rollback"),
    (["jobs"], "cmd_list"),
    (["jobs", "hold", "j", "--for", "2h", "--reason", "debugging"], "cmd_set"),
    (["jobs", "mute", "j", "--for", "30m", "--reason", "noisy"], "cmd_set"),
    (["jobs", "release", "j"], "cmd_end"),
    (["jobs", "unmute", "j"], "cmd_end"),
    (["describe", "j", "--json"], "cmd_describe"),
    (["kafka", "up", "--port", "19999"], "cmd_kafka_up"),
    (["kafka", "down", "--port", "19999"], "cmd_kafka_down"),
    (["kafka", "status", "--json"], "cmd_kafka_status"),
    (["kafka", "fetch"], "cmd_kafka_fetch"),
]


@pytest.mark.parametrize(("argv", "func"), EVERY_COMMAND, ids=lambda x: " ".join(x)
                         if isinstance(x, list) else x)
def test_every_subcommand_parses_to_its_function(argv: list[str], func: str) -> None:
    args = cli.parse_args(argv)
    assert args.func.__name__ == func


def test_the_tree_names_every_command() -> None:
    sub = next(a for a in cli.build_parser()._actions
               if isinstance(a, argparse._SubParsersAction))
    assert set(sub.choices) == {"run", "agent", "check", "process", "decisions", "logs",
                                "rules", "kafka", "notify", "status", "nodes", "actuate",
                                "diagnose", "keys", "jobs", "describe", "report",
                                "completion"}


def test_shared_options_are_the_same_everywhere(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FAULTWATCH_BOOTSTRAP", "env-host:9")
    monkeypatch.setenv("FAULTWATCH_TOPIC_PREFIX", "envp.")
    flags = ["--bootstrap", "h:1", "--topic-prefix", "p."]
    for argv, tail in ((["process"], []), (["decisions"], []), (["logs", "j"], []),
                       (["rules", "push", "a.yaml"], []), (["agent", "--job", "j"], ["--", "x"]),
                       (["agent", "tail", "--job", "j", "p"], []),
                       (["agent", "bootcheck", "--job", "j"], [])):
        args = cli.parse_args([*argv, *tail])
        assert (args.bootstrap, args.topic_prefix) == ("env-host:9", "envp."), argv
        args = cli.parse_args([*argv, *flags, *tail])
        assert (args.bootstrap, args.topic_prefix) == ("h:1", "p."), argv


def test_policy_flags_are_the_same_on_run_and_process() -> None:
    flags = ["--hang-window-s", "7", "--max-restarts", "2", "--no-restart",
             "--fault-tolerant-policy", "never"]
    want = {"hang_window_s": 7.0, "max_restarts": 2, "enable_restart": False,
            "fault_tolerant_policy": "never"}
    run = options.policy_overrides(cli.parse_args(["run", *flags, "--", "x"]))
    process = options.policy_overrides(cli.parse_args(["process", *flags]))
    assert run == process == want


# ---- `--` separates the wrapped command --------------------------------------------------

@pytest.mark.parametrize("name", ["tail", "bootcheck", "run", "agent", "--help", "--version"])
def test_a_training_command_after_dashdash_is_run_not_parsed(name: str) -> None:
    args = cli.parse_args(["agent", "--job", "j", "--", name, "-f", "x", "--", "y"])
    assert args.func is agent_cli.cmd_agent and args.agent_command is None
    assert args.cmd == [name, "-f", "x", "--", "y"]  # verbatim, its own -- included
    args = cli.parse_args(["run", "--", name, "--max-restarts", "9"])
    assert args.func is run_cli.cmd_run and args.cmd == [name, "--max-restarts", "9"]
    assert args.max_restarts is None  # the command's flag, not ours


def test_agent_config_runs_the_command_named_tail() -> None:
    args = cli.parse_args(["agent", "--job", "j", "--bootstrap", "b:1", "--", "tail", "-f",
                           "x"])
    assert agent_cli.config_from_args(args).cmd == ("tail", "-f", "x")


def test_agent_subcommands_are_subcommands_only_before_dashdash() -> None:
    args = cli.parse_args(["agent", "tail", "--job", "j", "a.log", "b.log"])
    assert args.func is agent_cli.cmd_agent_tail and args.paths == ["a.log", "b.log"]


@pytest.mark.parametrize("argv", [
    ["agent", "--job", "j", "python", "train.py"],  # no --: not a subcommand, an error
    ["run", "python", "train.py"],
    ["run", "--max-restarts", "1", "sh", "-c", "x"],
])
def test_a_command_without_dashdash_is_a_usage_error(argv: list[str],
                                                     capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(argv) == EXIT_USAGE
    err = capsys.readouterr().err
    assert "goes after --" in err, err


@pytest.mark.parametrize("argv", [["run"], ["run", "--"], ["agent", "--job", "j"],
                                  ["agent", "--job", "j", "--"]])
def test_no_command_at_all_is_a_usage_error(argv: list[str],
                                            capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(argv) == EXIT_USAGE
    assert "no command given" in capsys.readouterr().err


def test_unknown_command_and_bad_values_exit_2(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["nope"]) == EXIT_USAGE
    assert cli.main(["run", "--max-restarts", "many", "--", "x"]) == EXIT_USAGE
    assert cli.main(["kafka"]) == EXIT_USAGE
    assert cli.main(["--version"]) == 0
    assert "faultwatch" in capsys.readouterr().out


# ---- one handler, one exit-code table -----------------------------------------------------

def _all_error_classes() -> list[type[FaultwatchError]]:
    import importlib
    import pkgutil

    import faultwatch

    for m in pkgutil.walk_packages(faultwatch.__path__, "faultwatch."):
        if not m.name.endswith("__main__"):
            try:
                importlib.import_module(m.name)
            except ImportError:
                pass
    seen: list[type[FaultwatchError]] = []
    todo: list[type[FaultwatchError]] = [FaultwatchError]
    while todo:
        c = todo.pop()
        seen.append(c)
        todo.extend(c.__subclasses__())
    return seen


def _raiser(exc: BaseException) -> Any:
    def func(_args: argparse.Namespace) -> int:
        raise exc
    return func


EXPECTED: list[tuple[BaseException, int]] = [
    (FaultwatchError("boom"), EXIT_ERROR),
    (errors.ConfigError("bootstrap", "missing"), EXIT_USAGE),
    (errors.UsageError("no command"), EXIT_USAGE),
    (errors.RuleError([errors.RuleProblem("r.yaml", 3, "bad")]), EXIT_RULES),
    (errors.DecodeError("bad record", "t", 0, 5), EXIT_DECODE),
    (errors.BrokerError("unreachable"), EXIT_BROKER),
    (errors.MissingExtraError("processor", "process", "faust"), EXIT_MISSING_EXTRA),
    (errors.ChildError("no such file"), EXIT_CHILD_NOT_STARTED),
    (errors.RefusedError("rules push refused: unsigned"), errors.EXIT_REFUSED),
    (KeyboardInterrupt(), EXIT_INTERRUPTED),
]


@pytest.mark.parametrize(("exc", "code"), EXPECTED, ids=lambda x: type(x).__name__
                         if isinstance(x, BaseException) else str(x))
def test_the_handler_maps_each_error_to_its_code(exc: BaseException, code: int,
                                                 monkeypatch: pytest.MonkeyPatch,
                                                 capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setattr(rules_cli, "cmd_rules_test", _raiser(exc))
    assert cli.main(["rules", "test"]) == code
    err = capsys.readouterr().err
    if isinstance(exc, FaultwatchError):
        assert err.startswith("faultwatch: error: ") and str(exc) in err
        assert "Traceback" not in err


def test_a_real_command_error_reaches_the_handler(capsys: pytest.CaptureFixture[str],
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("FAULTWATCH_BOOTSTRAP", raising=False)
    assert cli.main(["decisions"]) == EXIT_USAGE
    assert "no Kafka bootstrap" in capsys.readouterr().err
    assert cli.main(["kafka", "up", "--port", "70000"]) == EXIT_BROKER
    assert "invalid port 70000" in capsys.readouterr().err


def test_rules_check_with_problems_exits_with_the_rules_code(tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("rules:\n  - id: x\n    category: nonsense\n")
    assert cli.main(["rules", "check", str(bad)]) == EXIT_RULES


def test_every_error_class_carries_a_documented_exit_code() -> None:
    table = _docs_table()
    for c in _all_error_classes():
        assert isinstance(c.exit_code, int) and 0 < c.exit_code < 256, c
        # a class documents itself, or inherits the code of a documented ancestor
        documented = [k for k in c.__mro__ if k.__name__ in table]
        assert documented, f"{c.__name__} is missing from the table in {DOCS}"
        assert table[documented[0].__name__] == c.exit_code, c


def test_the_docs_table_matches_the_code() -> None:
    table = _docs_table()
    for name in ("FaultwatchError", "ConfigError", "UsageError", "RuleError", "DecodeError",
                 "BrokerError", "MissingExtraError", "ChildError"):
        assert table[name] == getattr(errors, name).exit_code, name
    for name, code in VERDICTS.items():  # the exit contract of run/agent (exitcodes.py)
        assert table[name] == code, name
    assert table["interrupted"] == EXIT_INTERRUPTED
    assert table["broken-pipe"] == errors.EXIT_BROKEN_PIPE
    assert EXIT_BLACKLISTED == EXIT_BOOTCHECK_FAILED == table["elsewhere"]
    assert EXIT_FAILED_BY_DECISION == table["failed"]


def _docs_table() -> dict[str, int]:
    """`| 3 | `RuleError` | ... |` rows of the exit-code table in docs/cli.md."""
    rows = re.findall(r"^\| (\d+) \| `([\w-]+)`", DOCS.read_text(), re.M)
    assert rows, f"no exit-code table in {DOCS}"
    return {name: int(code) for code, name in rows}
