"""The one argparse tree of every `faultwatch` command and its one error handler.

Each command group registers itself from its own module (run, agent, check, process, read,
status, describe, diagnose, rules, kafka, nodes, jobs, actuate, notify, keys, report,
completion); their shared options come from options.py, their descriptions and examples from
helptext.py. Commands that wrap a training command (`run`, `agent`, `check`) take it only
after `--`."""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
from collections.abc import Sequence

from faultwatch import __version__
from faultwatch.cli import (
    actuate,
    agent,
    check,
    completion,
    describe,
    diagnose,
    helptext,
    jobs,
    kafka,
    keys,
    nodes,
    notify,
    options,
    process,
    read,
    report,
    rules,
    run,
    status,
)
from faultwatch.errors import (
    EXIT_BROKEN_PIPE,
    EXIT_INTERRUPTED,
    EXIT_OK,
    EXIT_USAGE,
    FaultwatchError,
)

WRAPPERS = ("run", "agent", "check")  # commands whose training command follows `--`
AGENT_SUBCOMMANDS = agent.SUBCOMMANDS
GROUPS = (run, agent, check, process, notify, status, describe, read, report, diagnose, rules,
          kafka, nodes, jobs, actuate, keys, completion)


def build_parser() -> options.Parser:
    """The one argparse tree of every `faultwatch` command."""
    parser = options.Parser(
        prog="faultwatch",
        description="Watch distributed training jobs' logs; decide restarts, blacklists, fails.",
        epilog="exit codes: docs/cli.md")
    parser.add_argument("--version", action="version", version=f"faultwatch {__version__}")
    sub = options.subcommands(parser, "command", required=True, metavar="COMMAND")
    for group in GROUPS:
        group.register(sub)
    helptext.apply(parser)
    completion.attach(parser)
    return parser


def split_command(argv: Sequence[str]) -> tuple[list[str], list[str]]:
    """(faultwatch's own arguments, the wrapped command): split at the first `--` of `run`
    and `agent`, so nothing of the command is read as an option or a subcommand."""
    args = list(argv)
    wraps = bool(args) and args[0] in WRAPPERS and not (
        args[0] == "agent" and len(args) > 1 and args[1] in AGENT_SUBCOMMANDS)
    if wraps and "--" in args:
        i = args.index("--")
        return args[:i], args[i + 1:]
    return args, []


def parse_args(argv: Sequence[str]) -> argparse.Namespace:
    """Parse a full command line; argparse's usage errors raise SystemExit(EXIT_USAGE)."""
    own, cmd = split_command(argv)
    parser = build_parser()
    args, unknown = parser.parse_known_args(own)
    if unknown:
        hint = (f" (the training command goes after --: faultwatch {args.command} [options] "
                f"-- CMD [ARGS...])" if args.command in WRAPPERS else "")
        chosen = options.chosen(parser, args)
        sub = chosen if isinstance(chosen, options.Parser) else parser
        sub.unrecognized(unknown, "" if sub.hint else hint)  # `run`'s own hint says it
    args.cmd = cmd
    return args


def main(argv: Sequence[str] | None = None) -> int:
    """The console script: parse, run the command, map every FaultwatchError to its exit
    code. Output into a pipe whose reader went away (`| head`) ends the command quietly with
    128+SIGPIPE, as a shell reports a program killed by it: no traceback."""
    try:
        code = _run(argv)
        sys.stdout.flush()  # what is still buffered meets a closed pipe here, not at exit
        return code
    except BrokenPipeError:
        with contextlib.suppress(OSError):  # nothing more reaches stdout, exit included
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return EXIT_BROKEN_PIPE


def _run(argv: Sequence[str] | None) -> int:
    try:
        args = parse_args(sys.argv[1:] if argv is None else argv)
    except SystemExit as e:  # --help, --version, usage errors (already printed)
        return EXIT_OK if e.code is None else e.code if isinstance(e.code, int) else EXIT_USAGE
    try:
        options.configure_logging(args)  # --log-format, -q, -v of the long-running commands
        if options.talks_to_kafka(args):  # every Kafka command: SSL/SASL settings, checked
            options.configure_kafka(args)
        return int(args.func(args))
    except FaultwatchError as e:
        print(f"faultwatch: error: {e}", file=sys.stderr)
        return e.exit_code
    except KeyboardInterrupt:
        return EXIT_INTERRUPTED
