"""The one argparse tree of every `faultwatch` command and its one error handler.

Each command group registers itself from its own module (run, agent, check, process, read,
status, describe, diagnose, rules, kafka, nodes, jobs, actuate, notify, keys, report,
completion); their shared options come from options.py, their descriptions and examples from
helptext.py. Only the module of the command given is imported: every other command is a stub
from the light table in commands.py (its name and one-line help), so `faultwatch rules
classify` does not pay for importing the agent, the actuators or the readers. Commands that
wrap a training command (`run`, `agent`, `check`) take it only after `--`."""

from __future__ import annotations

import argparse
import contextlib
import importlib
import os
import sys
from collections.abc import Collection, Sequence

from faultwatch import __version__
from faultwatch.cli import helptext, options
from faultwatch.cli.commands import AGENT_SUBCOMMANDS, BY_NAME, COMMANDS, NEEDS_TREE
from faultwatch.errors import (
    EXIT_BROKEN_PIPE,
    EXIT_INTERRUPTED,
    EXIT_OK,
    EXIT_USAGE,
    FaultwatchError,
)

WRAPPERS = ("run", "agent", "check")  # commands whose training command follows `--`


def build_parser(full: Collection[str] | None = None) -> options.Parser:
    """The one argparse tree of every `faultwatch` command: with `full` None every command
    registered in full (its module imported); else only the commands named in `full` (and
    those their module registers with them: decisions, logs), the others as stubs of their
    name and help (what the top-level help and did-you-mean need)."""
    parser = options.Parser(
        prog="faultwatch",
        description="Watch distributed training jobs' logs; decide restarts, blacklists, fails.",
        epilog="exit codes: docs/cli.md")
    parser.add_argument("--version", action="version", version=f"faultwatch {__version__}")
    sub = options.subcommands(parser, "command", required=True, metavar="COMMAND")
    modules = None if full is None else {BY_NAME[n].module for n in full if n in BY_NAME}
    registered: set[str] = set()
    for c in COMMANDS:
        if modules is not None and c.module not in modules:
            sub.add_parser(c.name, help=c.help)
        elif c.module not in registered:  # one module may register several (read)
            registered.add(c.module)
            importlib.import_module(f"faultwatch.cli.{c.module}").register(sub)
    helptext.apply(parser)
    if full is None or "completion" in full:
        from faultwatch.cli import completion

        completion.attach(parser)
    return parser


def parser_for(own: Sequence[str]) -> options.Parser:
    """The tree `own` (faultwatch's own arguments) needs: the named command in full, or the
    whole tree for a command that describes it (completion); stubs alone for --help,
    --version, a misspelt or a missing command."""
    first = own[0] if own else ""
    if first in NEEDS_TREE:
        return build_parser()
    return build_parser((first,) if first in BY_NAME else ())


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
    parser = parser_for(own)
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
