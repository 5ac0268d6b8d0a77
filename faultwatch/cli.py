"""The `faultwatch` command line: a thin shell over the core, the agent and the processor."""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import orjson

from faultwatch import __version__
from faultwatch.errors import FaultwatchError
from faultwatch.topics import DEFAULT_PARTITIONS, DEFAULT_PREFIX, Topics

POLICY_FLAGS: tuple[tuple[str, type, str], ...] = (
    ("hang_window_s", float, "every rank silent this long -> hang (seconds)"),
    ("init_window_s", float, "silence allowed before an attempt's first output line "
                             "(default: max(hang window, 120 s))"),
    ("hang_floor_s", float, "shortest learned (adaptive) hang window (seconds)"),
    ("hang_ceiling_s", float, "longest learned hang window; used before anything is learned"),
    ("node_lost_s", float, "no heartbeat from a node this long -> node lost (seconds)"),
    ("exit_hang_window_s", float, "one node finished, others still running this long (seconds)"),
    ("max_restarts", int, "restarts before the job is failed"),
    ("settle_s", float, "wait this long after a failure for other ranks' errors (seconds)"),
    ("execution_mode", str, "sync (restart the whole job) or async (restart failed nodes)"),
    ("fault_tolerant_policy", str, "on_failure | exit_code_and_error_msg | never"),
    ("max_same_error", int, "the same error on one instance more than N times -> fail"),
    ("max_failure_rate", float, "fraction of failed nodes above which the job fails (-1 off)"),
)


def _bootstrap_default() -> str | None:
    return os.environ.get("FAULTWATCH_BOOTSTRAP")


def _add_kafka_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument("--bootstrap", default=_bootstrap_default(),
                   help="Kafka bootstrap HOST:PORT (default $FAULTWATCH_BOOTSTRAP)")
    p.add_argument("--topic-prefix", default=os.environ.get("FAULTWATCH_TOPIC_PREFIX",
                                                            DEFAULT_PREFIX),
                   help="topic name prefix (default $FAULTWATCH_TOPIC_PREFIX or 'faultwatch.')")


def _add_policy_flags(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("policy (overrides the rule files' policy: sections)")
    for name, typ, help_ in POLICY_FLAGS:
        g.add_argument("--" + name.replace("_", "-"), dest=name, type=typ, default=None,
                       help=help_)
    g.add_argument("--no-hang-detection", dest="hang_detection", action="store_const",
                   const=False, default=None, help="never decide a hang")
    g.add_argument("--no-adaptive-hang", dest="adaptive_hang", action="store_const",
                   const=False, default=None, help="never learn the hang window from the job")
    g.add_argument("--no-restart", dest="enable_restart", action="store_const", const=False,
                   default=None, help="never restart: every failure fails the job")


def _policy_overrides(args: argparse.Namespace) -> dict[str, Any]:
    names = [n for n, _, _ in POLICY_FLAGS] + ["hang_detection", "enable_restart",
                                                "adaptive_hang"]
    return {n: getattr(args, n) for n in names if getattr(args, n, None) is not None}


def _command(args: argparse.Namespace) -> tuple[str, ...]:
    cmd = list(args.cmd)
    if cmd and cmd[0] == "--":
        cmd = cmd[1:]
    if not cmd:
        raise FaultwatchError("no command given: put it after --, e.g. "
                              "`faultwatch run -- torchrun ...`")
    return tuple(cmd)


def _need_bootstrap(args: argparse.Namespace) -> str:
    if not args.bootstrap:
        raise FaultwatchError("no Kafka bootstrap: pass --bootstrap HOST:PORT or set "
                              "FAULTWATCH_BOOTSTRAP (`faultwatch kafka up` starts a local broker)")
    return str(args.bootstrap)


# ---- commands -----------------------------------------------------------------------------

def cmd_run(args: argparse.Namespace) -> int:
    from faultwatch.embedded import EmbeddedConfig, run_embedded
    from faultwatch.logs import set_component

    set_component("run")
    cfg = EmbeddedConfig(cmd=_command(args), rule_paths=tuple(args.rules or ()),
                         policy_overrides=_policy_overrides(args),
                         decisions_out=Path(args.decisions_out) if args.decisions_out else None,
                         job=args.job, term_grace_s=args.term_grace_s)
    return run_embedded(cfg)


def cmd_process(args: argparse.Namespace) -> int:
    from faultwatch.embedded import policy_for
    from faultwatch.logs import set_component
    from faultwatch.rules import load_ruleset
    from faultwatch.streams.faust_app import ProcessorConfig
    from faultwatch.streams.worker import run_worker

    set_component("process")
    ruleset = load_ruleset(args.rules or ())
    cfg = ProcessorConfig(bootstrap=_need_bootstrap(args), ruleset=ruleset,
                          policy=policy_for(ruleset, _policy_overrides(args)),
                          topics=Topics(args.topic_prefix), partitions=args.partitions,
                          app_id=args.app_id or "", policy_overrides=_policy_overrides(args))
    run_worker(cfg, stop_timeout_s=args.stop_timeout_s, loglevel=args.loglevel)
    return 0


def cmd_decisions(args: argparse.Namespace) -> int:
    from faultwatch.agents.decisions import decision_of_value
    from faultwatch.core.events import Decision
    from faultwatch.reading import read_topic, run_reader
    from faultwatch.render import render_decision
    from faultwatch.wire import decision_to_dict, job_key

    bootstrap = _need_bootstrap(args)
    topic = Topics(args.topic_prefix).decisions
    seen: set[str] = set()

    def emit(item: tuple[Any, Decision]) -> None:
        _, dec = item
        if dec.id in seen:  # decisions are idempotent: show each id once
            return
        seen.add(dec.id)
        if args.json:
            sys.stdout.write(orjson.dumps(decision_to_dict(dec)).decode() + "\n")
        else:
            sys.stdout.write(render_decision(dec) + "\n")
        sys.stdout.flush()

    key = job_key(args.job) if args.job else None
    return run_reader(read_topic(bootstrap, topic, follow=args.follow, key=key,
                                 decoder=decision_of_value), emit)


def cmd_logs(args: argparse.Namespace) -> int:
    from faultwatch.reading import read_topic, run_reader
    from faultwatch.render import render_line
    from faultwatch.rules.prefix import strip_rank
    from faultwatch.wire import lines_of

    bootstrap = _need_bootstrap(args)
    topic = Topics(args.topic_prefix).logs
    seen: set[tuple[str, str, str, int]] = set()

    def emit(item: tuple[Any, dict[str, Any]]) -> None:
        _, d = item
        if d.get("job") != args.job or d.get("t") != "lines":
            return
        node, run_id = str(d.get("node")), str(d.get("run_id", ""))
        for ln in lines_of(d):
            k = (node, run_id, ln.stream, ln.seq)
            if k in seen:  # redelivered after an agent restart or a broker outage
                continue
            seen.add(k)
            if args.json:
                rank, _ = strip_rank(ln.text, d.get("rank"))
                sys.stdout.write(orjson.dumps({
                    "node": node, "attempt": d.get("attempt"), "rank": rank,
                    "stream": ln.stream, "seq": ln.seq, "ts": ln.ts, "text": ln.text,
                    "flags": ln.flags}).decode() + "\n")
            else:
                rank, text = strip_rank(ln.text, d.get("rank"))
                sys.stdout.write(render_line(node, rank, ln.stream, text) + "\n")
        sys.stdout.flush()

    return run_reader(read_topic(bootstrap, topic, follow=args.follow), emit)


def cmd_rules_check(args: argparse.Namespace) -> int:
    from faultwatch.rules import check_files

    problems = check_files(args.files)
    for p in problems:
        print(p, file=sys.stderr)
    if not problems:
        print(f"ok: {len(args.files)} file(s)")
    return 1 if problems else 0


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
    return 1 if problems else 0


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


# ---- parser -------------------------------------------------------------------------------

def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="faultwatch",
        description="Watch distributed training jobs' logs; decide restarts, blacklists, fails.")
    parser.add_argument("--version", action="version", version=f"faultwatch {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    p = sub.add_parser("run", help="embedded mode: supervise CMD in-process, no Kafka")
    p.add_argument("--rules", action="append", metavar="FILE", help="rule file (repeatable)")
    p.add_argument("--decisions-out", metavar="FILE", help="append decisions as JSON lines")
    p.add_argument("--job", default="local", help="job name used in decisions")
    p.add_argument("--term-grace-s", type=float, default=10.0,
                   help="SIGTERM -> SIGKILL grace when stopping the command")
    _add_policy_flags(p)
    p.add_argument("cmd", nargs=argparse.REMAINDER, metavar="-- CMD [ARGS...]")
    p.set_defaults(func=cmd_run)

    p = sub.add_parser("process", help="cluster mode: run a processor worker (both stages)")
    _add_kafka_flags(p)
    p.add_argument("--rules", action="append", metavar="FILE", help="rule file (repeatable)")
    p.add_argument("--partitions", type=int, default=DEFAULT_PARTITIONS,
                   help="partitions of the logs/signals topics and the job table")
    p.add_argument("--app-id", help="consumer group / app id (default '<prefix>processor')")
    p.add_argument("--loglevel", default="warning", help="Faust worker log level")
    p.add_argument("--stop-timeout-s", type=float, default=10.0,
                   help="on SIGTERM/SIGINT, flush and exit within this long (seconds)")
    _add_policy_flags(p)
    p.set_defaults(func=cmd_process)

    p = sub.add_parser("decisions", help="print decisions from the decisions topic")
    _add_kafka_flags(p)
    p.add_argument("--job", help="only this job")
    p.add_argument("--follow", "-f", action="store_true", help="keep reading new decisions")
    p.add_argument("--json", action="store_true", help="one JSON object per line")
    p.set_defaults(func=cmd_decisions)

    p = sub.add_parser("logs", help="print the shipped lines of a job, all nodes and ranks")
    _add_kafka_flags(p)
    p.add_argument("job", help="job id")
    p.add_argument("--follow", "-f", action="store_true", help="keep reading new lines")
    p.add_argument("--json", action="store_true", help="one JSON object per line")
    p.set_defaults(func=cmd_logs)

    rules = sub.add_parser("rules", help="check, test and try rule files")
    rsub = rules.add_subparsers(dest="rules_command", required=True, metavar="SUBCOMMAND")
    p = rsub.add_parser("check", help="validate rule files: path:line: message, all at once")
    p.add_argument("files", nargs="+")
    p.set_defaults(func=cmd_rules_check)
    p = rsub.add_parser("test", help="run the inline tests of every rule")
    p.add_argument("files", nargs="*")
    p.add_argument("--no-builtin", action="store_true", help="test only the given files")
    p.set_defaults(func=cmd_rules_test)
    p = rsub.add_parser("classify", help="classify a failure log excerpt (one JSON object)")
    p.add_argument("--rules", action="append", metavar="FILE", help="rule file (repeatable)")
    p.add_argument("--exit-code", type=int, default=None, help="the failed process's exit code")
    p.add_argument("--explain", action="store_true", help="also list every rule match")
    p.add_argument("logfile", nargs="?", default="-", help="log file, or - for stdin")
    p.set_defaults(func=cmd_rules_classify)
    _register_optional(sub, rsub)
    return parser


def _register_optional(sub: Any, rsub: Any) -> None:
    """Subcommands that live beside their implementation (agent, kafka, rules push)."""
    from faultwatch import kafka_local
    from faultwatch.agents import cli as agent_cli

    kafka_local.register(sub)
    agent_cli.register(sub)
    try:
        from faultwatch.streams import rules_dist
    except ImportError:
        return
    rules_dist.register(rsub)


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return int(args.func(args))
    except FaultwatchError as e:
        print(f"faultwatch: error: {e}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
