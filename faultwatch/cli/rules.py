"""`faultwatch rules check|test|classify|push|show|diff`: validate, test, try, hot-push, show
and diff rule files."""

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
    from faultwatch.rules import layers

    problems = layers.check(args.files)
    for p in problems:
        print(p, file=sys.stderr)
    if not problems:
        print(f"ok: {len(args.files)} file(s)")
    return EXIT_RULES if problems else EXIT_OK


def cmd_rules_test(args: argparse.Namespace) -> int:
    from faultwatch.rules import layers, run_rule_tests

    problems = layers.check(args.files)
    if not problems:
        ruleset = layers.load(args.files, builtin=not args.no_builtin).ruleset
        problems = run_rule_tests(ruleset)
    for p in problems:
        print(p, file=sys.stderr)
    if not problems:
        print("ok: all inline rule tests passed")
    return EXIT_RULES if problems else EXIT_OK


def cmd_rules_classify(args: argparse.Namespace) -> int:
    from faultwatch.agents.exitcodes import (
        EXIT_ELSEWHERE,
        EXIT_FAILED,
        EXIT_RESTART,
        EXIT_UNDECIDED,
    )
    from faultwatch.rules import classify, layers

    rules = layers.load(args.rules or ())
    if args.logfile in (None, "-"):
        text = sys.stdin.buffer.read().decode("utf-8", errors="replace")
    else:
        text = Path(args.logfile).read_bytes().decode("utf-8", errors="replace")
    result = classify(rules.ruleset, text, args.exit_code, explain=args.explain,
                      policy=rules.policy)
    # what `faultwatch run` / `agent` would then exit with (docs/cli.md#exit-codes)
    result["exit_code"] = {"fail": EXIT_FAILED, "blacklist": EXIT_ELSEWHERE,
                           "restart": EXIT_RESTART, "notify": EXIT_UNDECIDED
                           }.get(str(result["action"]))
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
    from faultwatch.trust.keys import load_signing_key

    key = load_signing_key(args.signing_key_file)  # the operator's: processors verify it
    rs = asyncio.run(push(bootstrap, args.files, topics=topics, builtin=not args.no_builtin,
                          timeout_s=args.timeout_s, signing_key=key))
    print(f"pushed rules version {rs.version} ({len(rs.rules)} rules, {len(args.files)} "
          f"file(s)) to {topics.rules}" + (f", signed by key {key.key_id}" if key else
                                           ", unsigned"))
    return EXIT_OK


def _rules_local(args: argparse.Namespace) -> bool:
    """`rules show`/`diff` read the local set (embedded mode) when given --rules or --local,
    or when no bootstrap is known; else the processors' (cluster mode)."""
    return bool(args.local or args.rules or not args.bootstrap)


def cmd_rules_show(args: argparse.Namespace) -> int:
    from faultwatch.streams import rules_show

    if _rules_local(args):
        return rules_show.show_local(args.rules or (), rule_id=args.rule, as_json=args.json)
    return rules_show.show_cluster(args.bootstrap, options.topics(args), rule_id=args.rule,
                                   as_json=args.json)


def cmd_rules_diff(args: argparse.Namespace) -> int:
    from faultwatch.streams import rules_show

    return rules_show.diff_main(args.files, current=args.rules,
                                bootstrap=None if _rules_local(args) else args.bootstrap,
                                topics=options.topics(args), as_json=args.json,
                                exit_code=args.exit_code)


def register(sub: Any) -> None:
    rules = sub.add_parser("rules", help="check, test, try, push, show and diff rule files")
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
                   help="the files replace the built-in rule set instead of extending it "
                        "(honoured only from a signed push)")
    p.add_argument("--signing-key-file", type=Path, default=None,
                   help="operator's Ed25519 key that signs the rule set (default "
                        "$FAULTWATCH_SIGNING_KEY_FILE; see `faultwatch keys`)")
    p.add_argument("--timeout-s", type=float, default=30.0, help="Kafka timeout (seconds)")
    p.set_defaults(func=cmd_rules_push)
    p = rsub.add_parser("show", help="the rules in force per processor worker (version, "
                                     "layers, files, push), or the local set with --rules")
    options.add_kafka(p)
    options.add_rules(p)
    p.add_argument("--local", action="store_true",
                   help="the local set (embedded mode), even with a bootstrap known")
    p.add_argument("--rule", metavar="ID", help="why this rule is what it is: every layer and "
                                                "file that defined it, the one in force last")
    options.add_json(p, "one JSON object per worker")
    p.set_defaults(func=cmd_rules_show)
    p = rsub.add_parser("diff", help="what rule files change against what runs: the pushed "
                                     "set (a pending push), or the local --rules files")
    options.add_kafka(p)
    options.add_rules(p)
    p.add_argument("files", nargs="+", metavar="FILE")
    p.add_argument("--local", action="store_true",
                   help="against the local set (built-in + --rules files), not the pushed one")
    options.add_json(p, "the diff as one JSON object")
    p.add_argument("--exit-code", action="store_true",
                   help="exit 1 when the sets differ (like git diff --exit-code)")
    p.set_defaults(func=cmd_rules_diff)
