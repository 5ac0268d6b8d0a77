"""The shared options are shared (issue 21, item 4): every command that talks to Kafka has the
same Kafka options (the security flags too), a missing bootstrap exits with one code in every
command, no option is ever abbreviated, and docs/cli.md names every command and shared option."""

from __future__ import annotations

import argparse
import re
from collections.abc import Iterator
from pathlib import Path

import pytest

from faultwatch import cli
from faultwatch.cli import options
from faultwatch.errors import EXIT_USAGE

DOCS = Path(__file__).resolve().parents[3] / "docs" / "cli.md"
BUILTIN = sorted((Path(__file__).resolve().parents[3] / "faultwatch" / "rules" /
                  "builtin").glob("*.yaml"))[0]
KAFKA_FLAGS = ("--bootstrap", "--topic-prefix", "--kafka-config", "--kafka-security-protocol",
               "--kafka-sasl-mechanism", "--kafka-username", "--kafka-password-file",
               "--kafka-ca-file", "--kafka-cert-file", "--kafka-key-file",
               "--kafka-check-hostname")


def _parsers(p: argparse.ArgumentParser, path: tuple[str, ...] = ()
             ) -> Iterator[tuple[tuple[str, ...], argparse.ArgumentParser]]:
    """Every parser of the tree with its command path, the root first."""
    yield path, p
    for a in p._actions:  # noqa: SLF001 - argparse keeps subparsers nowhere else
        if isinstance(a, argparse._SubParsersAction):  # noqa: SLF001
            for name, sp in a.choices.items():
                yield from _parsers(sp, (*path, name))


def _flags(p: argparse.ArgumentParser) -> set[str]:
    return set(p._option_string_actions)  # noqa: SLF001


def test_the_walk_sees_the_whole_tree() -> None:
    paths = {" ".join(path) for path, _ in _parsers(cli.build_parser())}
    assert {"", "decisions", "nodes", "nodes release", "actuate", "agent tail",
            "rules push", "kafka up"} <= paths


def test_no_parser_abbreviates() -> None:
    for path, p in _parsers(cli.build_parser()):
        assert p.allow_abbrev is False, " ".join(path) or "faultwatch"


@pytest.mark.parametrize("argv", [
    ["decisions", "--topic", "x."],  # was read as --topic-prefix x.
    ["logs", "j", "--boot", "h:1"],
    ["nodes", "--js"],
    ["actuate", "--backend", "exec", "--max-decision", "5"],
])
def test_an_abbreviated_option_is_a_usage_error(argv: list[str],
                                                capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(argv) == EXIT_USAGE
    assert "unrecognized arguments" in capsys.readouterr().err


def test_every_kafka_command_has_every_kafka_option() -> None:
    kafka_commands = []
    for path, p in _parsers(cli.build_parser()):
        if "--bootstrap" in _flags(p):
            kafka_commands.append(" ".join(path))
            missing = set(KAFKA_FLAGS) - _flags(p)
            assert not missing, f"faultwatch {' '.join(path)} lacks {sorted(missing)}"
    assert {"nodes", "nodes quarantine", "nodes release", "actuate", "notify", "decisions",
            "logs", "status", "diagnose", "process", "rules push", "agent"} <= \
        set(kafka_commands)


@pytest.mark.parametrize("argv", [
    ["nodes"], ["nodes", "release", "n1"], ["actuate", "--backend", "exec"],
])
def test_nodes_and_actuate_take_the_security_flags(argv: list[str], tmp_path: Path,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    for k in ("FAULTWATCH_KAFKA_CONFIG", "FAULTWATCH_KAFKA_SECURITY_PROTOCOL"):
        monkeypatch.delenv(k, raising=False)
    pw = tmp_path / "pw"
    pw.write_text("secret\n")
    args = cli.parse_args([*argv, "--kafka-security-protocol", "SASL_PLAINTEXT",
                           "--kafka-username", "u", "--kafka-password-file", str(pw),
                           "--kafka-sasl-mechanism", "SCRAM-SHA-512"])
    sec = options.kafka_security(args)
    assert (sec.security_protocol, sec.username, sec.password, sec.sasl_mechanism) == (
        "SASL_PLAINTEXT", "u", "secret", "SCRAM-SHA-512")


def test_nodes_options_before_the_subcommand_are_kept() -> None:
    args = cli.parse_args(["nodes", "--bootstrap", "h:1", "--kafka-username", "u",
                           "release", "n1"])
    assert (args.bootstrap, args.kafka_username) == ("h:1", "u")
    args = cli.parse_args(["nodes", "release", "n1", "--bootstrap", "h:2"])
    assert args.bootstrap == "h:2"


@pytest.mark.parametrize("argv", [
    ["decisions"], ["logs", "j"], ["status"], ["diagnose", "j"], ["nodes"],
    ["nodes", "release", "n1"], ["nodes", "quarantine", "n1", "--for", "1h", "--reason", "r"],
    ["actuate", "--backend", "exec"], ["notify", "--webhook", "http://127.0.0.1:9/x"],
    ["rules", "push", str(BUILTIN)],
])
def test_a_missing_bootstrap_is_one_exit_code_everywhere(
        argv: list[str], monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.delenv("FAULTWATCH_BOOTSTRAP", raising=False)
    assert cli.main(argv) == EXIT_USAGE
    err = capsys.readouterr().err
    assert "faultwatch: error: bootstrap: no Kafka bootstrap" in err, err


# ---- docs/cli.md says what the parser does ------------------------------------------------

def _section(title: str) -> str:
    text = DOCS.read_text()
    start = text.index(title)
    end = text.find("\n## ", start + len(title))
    return text[start:end if end >= 0 else len(text)]


def test_docs_list_every_command() -> None:
    table = _section("# The `faultwatch` command line")
    documented = set(re.findall(r"^\| `faultwatch ([\w-]+)", table, re.M))
    for path, _p in _parsers(cli.build_parser()):
        if len(path) == 1:
            assert path[0] in documented, f"docs/cli.md lists no `faultwatch {path[0]}`"
        elif len(path) == 2:  # subcommands appear in their command's row
            assert re.search(rf"`[^`]*\b{path[0]}\b[^`]*\b{path[1]}\b", table), \
                f"docs/cli.md does not name `faultwatch {' '.join(path)}`"
    assert documented <= {path[0] for path, _ in _parsers(cli.build_parser()) if path}


def test_docs_list_every_shared_option_once() -> None:
    shared = _section("## Shared options")
    probe = argparse.ArgumentParser()
    options.add_kafka(probe)
    flags = {f for f in _flags(probe) if f.startswith("--") and f != "--help"}
    assert flags == set(KAFKA_FLAGS)
    for f in flags:
        assert f"`{f}" in shared, f"docs/cli.md's shared options do not list {f}"
    text = DOCS.read_text()
    assert text.count("`--kafka-security-protocol`") == 1  # defined once, not per command
