"""`faultwatch rules check|test|classify|push`: validate, test, try and hot-push rule files."""

from __future__ import annotations

import argparse
import asyncio
import sys
from pathlib import Path
from typing import Any

import orjson

from faultwatch.cli import options
from faultwatch.errors import EXIT_OK, EXIT_RULES, RuleError


def cmd_rules_check(args: argparse.Namespace) -> int:
    from faultwatch.rules import check_files

    problems = check_files(args.files)
    for p in problems:
        print(p, file=sys.stderr)
    if not problems:
        print(f"ok: {len(args.files)} file(s)")
    return EXIT_RULES if problems else EXIT_OK


def cmd_rules_test(args: argparse.Namespace) -> int:
    from faultwatch.rules import check_files, load_ruleset, run_rule_tests

    problems = check_files(args.files)
    if not problems:
        ruleset = load_ruleset(args.files, builtin=not args.no_builtin)
        problems = run_rule_tests(ruleset)
    for p in problems:
        print(p, file=sys.stderr)
    if not problems:
        print("ok: all inline rule tests passed")
    return EXIT_RULES if problems else EXIT_OK


def cmd_rules_classify(args: argparse.Namespace) -> int:
    from faultwatch.rules import classify, load_ruleset

    ruleset = load_ruleset(args.rules or ())
    if args.logfile in (None, "-"):
        text = sys.stdin.buffer.read().decode("utf-8", errors="replace")
    else:
        text = Path(args.logfile).read_bytes().decode("utf-8", errors="replace")
    result = classify(ruleset, text, args.exit_code, explain=args.explain)
    sys.stdout.write(orjson.dumps(result).decode() + "\n")
    return 0


def cmd_rules_push(args: argparse.Namespace) -> int:
    from faultwatch.streams.rules_push import push
    from faultwatch.streams.rules_record import build_record

    try:
        build_record(args.files, builtin=not args.no_builtin)  # validate before needing Kafka
    except RuleError as e:
        for p in e.problems:
            print(p, file=sys.stderr)
        print(f"not pushed: {len(e.problems)} problem(s)", file=sys.stderr)
        return e.exit_code
    bootstrap = options.need_bootstrap(args)
    topics = options.topics(args)
    rs = asyncio.run(push(bootstrap, args.files, topics=topics, builtin=not args.no_builtin,
                          timeout_s=args.timeout_s))
    print(f"pushed rules version {rs.version} ({len(rs.rules)} rules, {len(args.files)} "
          f"file(s)) to {topics.rules}")
    return EXIT_OK


def register(sub: Any) -> None:
    rules = sub.add_parser("rules", help="check, test, try and push rule files")
    rsub = options.subcommands(rules, "rules_command", required=True, metavar="SUBCOMMAND")
    p = rsub.add_parser("check", help="validate rule files: path:line: message, all at once")
    p.add_argument("files", nargs="+", metavar="FILE")
    p.set_defaults(func=cmd_rules_check)
    p = rsub.add_parser("test", help="run the inline tests of every rule")
    p.add_argument("files", nargs="*", metavar="FILE")
    p.add_argument("--no-builtin", action="store_true", help="test only the given files")
    p.set_defaults(func=cmd_rules_test)
    p = rsub.add_parser("classify", help="classify a failure log excerpt (one JSON object)")
    options.add_rules(p)
    p.add_argument("--exit-code", type=int, default=None, help="the failed process's exit code")
    p.add_argument("--explain", action="store_true", help="also list every rule match")
    p.add_argument("logfile", nargs="?", default="-", help="log file, or - for stdin")
    p.set_defaults(func=cmd_rules_classify)
    p = rsub.add_parser("push", help="validate rule files and publish them to every processor")
    options.add_kafka(p)
    p.add_argument("files", nargs="+", metavar="FILE")
    p.add_argument("--no-builtin", action="store_true",
                   help="the files replace the built-in rule set instead of extending it")
    p.add_argument("--timeout-s", type=float, default=30.0, help="Kafka timeout (seconds)")
    p.set_defaults(func=cmd_rules_push)
