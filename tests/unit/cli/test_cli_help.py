"""`--help`, typos and pipes as a person and a shell meet them (issue 36 items 6, 7, 9): every
command says what it does with examples that parse, options show their defaults, the shared
Kafka options come last, a misspelt command or option names the close ones, the completion
script completes in a real bash, and output into a pipe whose reader went away ends quietly."""

from __future__ import annotations

import argparse
import os
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from faultwatch import cli
from faultwatch.cli import completion, helptext, options
from faultwatch.errors import EXIT_BROKEN_PIPE, EXIT_USAGE
from tests.support.processes import faultwatch_exe, job_env


def _tree() -> list[tuple[str, argparse.ArgumentParser]]:
    return [(" ".join(path), p) for path, p in helptext.walk(cli.build_parser())]


def _examples(p: argparse.ArgumentParser) -> list[str]:
    epilog = p.epilog or ""
    block = epilog.split("examples:\n", 1)[1] if "examples:\n" in epilog else ""
    return [line.strip() for line in block.splitlines() if line.startswith("  faultwatch")]


def test_every_command_has_a_description_and_examples() -> None:
    tree = _tree()
    assert len(tree) > 30
    for path, p in tree:
        assert p.description, f"`faultwatch {path}` has no description"
        assert _examples(p), f"`faultwatch {path} --help` shows no example"
    rules_check = dict(tree)["rules check"].format_help()
    assert len(rules_check.splitlines()) > 8 and "3 with problems" in rules_check


def test_every_example_parses() -> None:
    """An example that stops parsing (a flag renamed) fails here, not in a reader's shell."""
    for path, p in _tree():
        for example in _examples(p):
            line = example.split(" | ")[0].split(" > ")[0]
            argv = shlex.split(line.replace("$", ""))[1:]
            try:
                cli.parse_args(argv)
            except SystemExit as e:
                pytest.fail(f"`faultwatch {path}` example does not parse ({e.code}): {example}")


def test_options_show_their_default() -> None:
    for path, p in _tree():
        assert issubclass(p.formatter_class, options.HelpFormatter), path
        text = p.format_help()
        for a in p._actions:  # noqa: SLF001
            d = a.default
            if (not a.option_strings or a.nargs == 0 or d in (None, [], argparse.SUPPRESS)
                    or isinstance(d, bool)):
                continue
            shown = options.HelpFormatter("x")._get_help_string(a)  # noqa: SLF001
            assert "default" in shown, f"`faultwatch {path}` {a.option_strings[0]}: no default"
            assert "default" in text
    run = dict(_tree())["run"].format_help()
    for flag, default in (("--max-restarts N", "default 3"), ("--settle-s S", "default 3"),
                          ("--hang-floor-s S", "default 30")):
        assert default in run.split(flag, 1)[1].split("\n  --", 1)[0], flag


def test_the_kafka_options_come_after_the_commands_own() -> None:
    logs = dict(_tree())["logs"]
    usage = logs.format_usage()
    assert "[--bootstrap HOST:PORT] [Kafka options]" in usage
    assert "--kafka-ca-file" not in usage and "--topic-prefix" not in usage
    assert len(usage.splitlines()) <= 6, usage
    assert usage.index("--grep") < usage.index("Kafka options") < usage.rindex("job")
    text = logs.format_help()
    assert text.index("--grep REGEX") < text.index("Kafka options (") < \
        text.index("--kafka-ca-file FILE")


@pytest.mark.parametrize(("argv", "said"), [
    (["stauts"], "invalid choice: 'stauts' (did you mean 'status'?)"),
    (["rules", "sho"], "invalid choice: 'sho' (did you mean 'show'?)"),
    (["decisions", "--jbo", "llama"], "unrecognized arguments: --jbo llama (did you mean "
                                      "'--job'"),
    (["decisions", "--action", "restrat"], "invalid choice: 'restrat' (did you mean "
                                           "'restart'?)"),
    (["run", "--max-restart", "1", "--", "true"], "(did you mean '--max-restarts'"),
])
def test_a_typo_names_the_close_ones(argv: list[str], said: str,
                                     capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(argv) == EXIT_USAGE
    err = capsys.readouterr().err
    assert said in err, err
    assert err.count("the training command goes after --") <= 2  # said once, then as hint


def test_a_typo_far_from_everything_suggests_nothing(capsys: pytest.CaptureFixture[str]
                                                     ) -> None:
    assert cli.main(["zzzzzz"]) == EXIT_USAGE  # positive control of the one above
    assert "did you mean" not in capsys.readouterr().err


def _complete(script: Path, words: str) -> list[str]:
    argv = shlex.split(words) + ([""] if words.endswith(" ") else [])
    arr = " ".join(shlex.quote(w) for w in argv)
    out = subprocess.run(
        ["bash", "-c", f"source {shlex.quote(str(script))}; COMP_WORDS=({arr}); "
                       f"COMP_CWORD={len(argv) - 1}; _faultwatch; "
                       'printf "%s\\n" "${COMPREPLY[@]}"'],
        capture_output=True, text=True, timeout=60, check=True)
    return out.stdout.split()


def test_the_bash_completion_completes_commands_options_and_choices(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    assert shutil.which("bash")
    script = tmp_path / "faultwatch.bash"
    script.write_text(completion.script(cli.build_parser(), "bash"))
    assert _complete(script, "faultwatch stat") == ["status"]
    assert _complete(script, "faultwatch rules sh") == ["show"]
    assert _complete(script, "faultwatch decisions --j") == ["--job", "--json"]
    assert _complete(script, "faultwatch decisions --action ") == [
        "restart", "blacklist", "fail", "notify"]
    assert "--max-restarts" in _complete(script, "faultwatch run --max-")
    assert "--max-restarts" not in _complete(script, "faultwatch status --max-")
    (tmp_path / "site.yaml").write_text("rules: []\n")
    monkeypatch.chdir(tmp_path)
    assert _complete(script, "faultwatch rules check si") == ["site.yaml"]
    zsh = completion.script(cli.build_parser(), "zsh")
    assert "bashcompinit" in zsh and "complete -o filenames -F _faultwatch faultwatch" in zsh


def _into_a_closed_pipe(argv: list[str]) -> subprocess.CompletedProcess[str]:
    """Run `faultwatch ARGV` with stdout a real pipe whose reader is gone (what `| head`
    leaves once head has exited)."""
    read, write = os.pipe()
    os.close(read)
    try:
        return subprocess.run([faultwatch_exe(), *argv], stdout=write, stderr=subprocess.PIPE,
                              text=True, timeout=120, env=job_env(FAULTWATCH_BOOTSTRAP=""))
    finally:
        os.close(write)


@pytest.mark.parametrize("argv", [
    ["kafka", "acls", "--topic-prefix", "p."],
    ["completion", "bash"],
    ["rules", "show", "--local"],
])
def test_a_reader_that_went_away_ends_the_command_quietly(argv: list[str]) -> None:
    res = _into_a_closed_pipe(argv)
    assert res.returncode == EXIT_BROKEN_PIPE, res.stderr
    assert "Traceback" not in res.stderr and "BrokenPipe" not in res.stderr, res.stderr


def test_the_same_commands_into_a_reader_exit_0() -> None:
    """Positive control: the commands above do print, and succeed, into a live reader."""
    res = subprocess.run([faultwatch_exe(), "kafka", "acls", "--topic-prefix", "p."],
                         capture_output=True, text=True, timeout=120,
                         env=job_env(FAULTWATCH_BOOTSTRAP=""))
    assert res.returncode == 0 and res.stdout.count("\n") > 10, res.stderr
    assert sys.executable  # the subprocesses ran this interpreter's faultwatch


@pytest.mark.parametrize(("log", "code", "action", "exit_code"), [
    ("torch.OutOfMemoryError: CUDA out of memory.", "1", "fail", 78),
    ("something no rule knows", "1", "fail", 78),  # was `action: null`
    ("ConnectionError: [Errno 104] Connection reset by peer", "1", "restart", 75),
    ("NVRM: Xid (PCI:0000:3b:00): 79, pid=1, GPU has fallen off the bus.", "1", "blacklist",
     138),
    ("all is well", "0", None, None),  # no failure: nothing to decide
])
def test_rules_classify_says_what_the_pipeline_does_and_the_exit_code(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], log: str, code: str,
        action: str | None, exit_code: int | None) -> None:
    import json

    (tmp_path / "crash.log").write_text(log + "\n")
    assert cli.main(["rules", "classify", "--exit-code", code, str(tmp_path / "crash.log")]) == 0
    out = json.loads(capsys.readouterr().out)
    assert (out["action"], out["exit_code"]) == (action, exit_code), out
