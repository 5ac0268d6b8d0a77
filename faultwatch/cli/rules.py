"""`faultwatch rules check|test|classify|push|history|rollback|show|diff`: validate, test, try,
hot-push, list and undo pushes, show and diff rule files."""

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
    from faultwatch.rollout.rules_push import push
    from faultwatch.rollout.rules_record import build_record

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
    from faultwatch.rollout.write_check import check_operator_write
    from faultwatch.trust.records import RULES

    # a set every verifying worker would refuse is refused here (exit 8), not "pushed"
    check_operator_write(bootstrap, topics.status, RULES, key, "rules push")
    rs, rev = asyncio.run(push(bootstrap, args.files, topics=topics,
                               builtin=not args.no_builtin, timeout_s=args.timeout_s,
                               signing_key=key))
    print(f"pushed rules version {rs.version} ({len(rs.rules)} rules, {len(args.files)} "
          f"file(s)) to {topics.rules} as revision {rev}"
          + (f", signed by key {key.key_id}" if key else ", unsigned"))
    return EXIT_OK


def cmd_rules_history(args: argparse.Namespace) -> int:
    from faultwatch.rollout.rules_push import read_history

    revs, current = asyncio.run(read_history(options.need_bootstrap(args), options.topics(args),
                                             args.timeout_s))
    if args.json:
        for r in revs:
            print(orjson.dumps({**r.summary(), "in_force": current is not None
                                and r.revision == current.revision}).decode())
        return EXIT_OK
    if not revs and current is None:
        print("nothing pushed: each worker runs its built-in and --rules files")
    for r in revs:
        here = current is not None and r.revision == current.revision
        print(("* " if here else "  ") + r.line())
    if current is not None and current.revision < 0:
        print(f"* (unnumbered) version {current.record.get('version')}: pushed by an older "
              "faultwatch")
    return EXIT_OK


def cmd_rules_rollback(args: argparse.Namespace) -> int:
    from faultwatch.rollout.rules_push import rollback
    from faultwatch.rollout.write_check import check_operator_write
    from faultwatch.trust.keys import load_signing_key
    from faultwatch.trust.records import RULES

    bootstrap = options.need_bootstrap(args)
    topics = options.topics(args)
    key = load_signing_key(args.signing_key_file)  # signed like a push: processors verify it
    check_operator_write(bootstrap, topics.status, RULES, key, "rules rollback")
    target, was, rev, rs = asyncio.run(rollback(bootstrap, topics=topics, to=args.to_revision,
                                                timeout_s=args.timeout_s, signing_key=key))
    what = "nothing pushed (built-in and each worker's --rules files)" \
        if target.revision == 0 else f"revision {target.revision}: {target.describe()}"
    print(f"rolled back rules to {what}")
    print(f"  now revision {rev}, version {rs.version} ({len(rs.rules)} rules); was "
          + (f"revision {was.revision}" if was is not None and was.revision > 0 else "unnumbered")
          + (f", version {was.record.get('version')}" if was is not None else "")
          + f"; on {topics.rules}" + (f", signed by key {key.key_id}" if key else ", unsigned"))
    return EXIT_OK


def _rules_local(args: argparse.Namespace) -> bool:
    """`rules show`/`diff` read the local set (embedded mode) when given --rules or --local,
    or when no bootstrap is known; else the processors' (cluster mode)."""
    return bool(args.local or args.rules or not args.bootstrap)


def cmd_rules_show(args: argparse.Namespace) -> int:
    from faultwatch.rollout import rules_show

    if _rules_local(args):
        return rules_show.show_local(args.rules or (), rule_id=args.rule, as_json=args.json)
    return rules_show.show_cluster(args.bootstrap, options.topics(args), rule_id=args.rule,
                                   as_json=args.json)


def cmd_rules_diff(args: argparse.Namespace) -> int:
    from faultwatch.rollout import rules_show

    return rules_show.diff_main(args.files, current=args.rules,
                                bootstrap=None if _rules_local(args) else args.bootstrap,
                                topics=options.topics(args), as_json=args.json,
                                exit_code=args.exit_code)


def register(sub: Any) -> None:
    rules = sub.add_parser("rules", help="check, test, try, push, roll back, show and diff "
                                         "rule files")
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
    options.add_signing_key_file(p, "the rule set")
    p.add_argument("--timeout-s", type=float, default=30.0, help="Kafka timeout (seconds)")
    p.set_defaults(func=cmd_rules_push)
    p = rsub.add_parser("history", help="the pushed rule sets kept on the rules topic, "
                                        "numbered (the one in force starred)",
                        description="The last pushes, oldest first, like `kubectl rollout "
                                    "history`: revision, version, push id, author, time, files.")
    options.add_kafka(p)
    options.add_json(p, "one JSON object per revision")
    p.add_argument("--timeout-s", type=float, default=30.0, help="Kafka timeout (seconds)")
    p.set_defaults(func=cmd_rules_history)
    p = rsub.add_parser("rollback", help="undo a push: push an earlier revision's files again "
                                         "(like kubectl rollout undo)",
                        description="Push the files of the revision before the one in force "
                                    "(or --to-revision N; 0 removes the pushed set) again, as "
                                    "a new revision, signed with your operator key like a "
                                    "push. Example: faultwatch rules rollback --to-revision 3")
    options.add_kafka(p)
    p.add_argument("--to-revision", type=int, default=None, metavar="N",
                   help="the revision to go back to (default: the one before the set in "
                        "force; see `rules history`)")
    options.add_signing_key_file(p, "the rule set")
    p.add_argument("--timeout-s", type=float, default=30.0, help="Kafka timeout (seconds)")
    p.set_defaults(func=cmd_rules_rollback)
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
