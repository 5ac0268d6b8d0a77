"""The `faultwatch` command line: one argparse tree, one error handler, one exit-code table.

Each command's function is a thin call into its implementation (embedded mode, the agent, the
processor, the readers, the rules tooling, the local broker). Shared options are defined once
below; commands that wrap a training command (`run`, `agent`) take it only after `--`.
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.util
import json
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any, NoReturn

import orjson

from faultwatch import __version__
from faultwatch.agents.config import (
    EXIT_BLACKLISTED,
    EXIT_BOOTCHECK_FAILED,
    EXIT_FAILED,
    EXIT_NODES_TIMEOUT,
    EXIT_RESTART,
    EXIT_UNDECIDED,
    ON_RESTART,
)
from faultwatch.errors import (
    EXIT_INTERRUPTED,
    EXIT_OK,
    EXIT_RULES,
    EXIT_USAGE,
    BrokerError,
    ConfigError,
    FaultwatchError,
    MissingExtraError,
    RuleError,
    UsageError,
)
from faultwatch.kafka import settings as kafka_settings
from faultwatch.notify import cli as notify_cli
from faultwatch.wire.topics import DEFAULT_PARTITIONS, DEFAULT_PREFIX, Topics

WRAPPERS = ("run", "agent")  # commands whose training command follows `--`
AGENT_SUBCOMMANDS = ("tail", "bootcheck")

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
    """--bootstrap and --topic-prefix, for every command that talks to Kafka."""
    p.add_argument("--bootstrap", default=_bootstrap_default(),
                   help="Kafka bootstrap HOST:PORT (default $FAULTWATCH_BOOTSTRAP)")
    p.add_argument("--topic-prefix", default=os.environ.get("FAULTWATCH_TOPIC_PREFIX",
                                                            DEFAULT_PREFIX),
                   help="topic name prefix (default $FAULTWATCH_TOPIC_PREFIX or 'faultwatch.')")
    kafka_settings.add_arguments(p)


def _add_rules_flag(p: argparse.ArgumentParser) -> None:
    p.add_argument("--rules", action="append", metavar="FILE",
                   help="rule file, added to the built-in rules (repeatable)")


def _add_policy_flags(p: argparse.ArgumentParser) -> None:
    """The policy overrides shared by `run` and `process`."""
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
    if not args.cmd:
        raise UsageError(f"no command given: put it after --, e.g. "
                         f"`faultwatch {args.command} -- torchrun ...`")
    return tuple(args.cmd)


def _need_bootstrap(args: argparse.Namespace) -> str:
    if not args.bootstrap:
        raise ConfigError("bootstrap", "no Kafka bootstrap: pass --bootstrap HOST:PORT or set "
                          "FAULTWATCH_BOOTSTRAP (`faultwatch kafka up` starts a local broker)")
    return str(args.bootstrap)


def _require_extra(extra: str, command: str, module: str) -> None:
    """Fail with MissingExtraError when `module` (of the `extra` extra) is not installed."""
    if importlib.util.find_spec(module) is None:
        raise MissingExtraError(extra, command, module)


# ---- commands -----------------------------------------------------------------------------

def cmd_run(args: argparse.Namespace) -> int:
    from faultwatch.embedded import EmbeddedConfig, run_embedded
    from faultwatch.logs import set_component

    set_component("run")
    cfg = EmbeddedConfig(cmd=_command(args), rule_paths=tuple(args.rules or ()),
                         policy_overrides=_policy_overrides(args),
                         decisions_out=Path(args.decisions_out) if args.decisions_out else None,
                         job=args.job, term_grace_s=args.term_grace_s,
                         decision_wait_s=args.decision_wait_s,
                         verdict_out=Path(args.verdict_out) if args.verdict_out else None,
                         on_restart=args.on_restart,
                         control_out=Path(args.control_out) if args.control_out else None,
                         attempt=_run_attempt())
    return run_embedded(cfg)


def _run_attempt() -> int:
    """`run`'s first attempt: $FAULTWATCH_ATTEMPT (a relauncher's count), else 0."""
    v = os.environ.get("FAULTWATCH_ATTEMPT", "").strip()
    try:
        return int(v) if v else 0
    except ValueError:
        raise ConfigError("FAULTWATCH_ATTEMPT", f"not an integer: {v!r}") from None


def cmd_process(args: argparse.Namespace) -> int:
    _require_extra("processor", "process", "faust")  # the node side installs without Faust
    from faultwatch.logs import set_component
    from faultwatch.rules import layers
    from faultwatch.streams.faust_app import ProcessorConfig
    from faultwatch.streams.worker import run_worker

    set_component("process")
    rules = layers.load(args.rules or (), flags=_policy_overrides(args))
    cfg = ProcessorConfig(bootstrap=_need_bootstrap(args), ruleset=rules.ruleset,
                          policy=rules.policy, rules=rules,
                          topics=Topics(args.topic_prefix), partitions=args.partitions,
                          app_id=args.app_id or "", policy_overrides=_policy_overrides(args),
                          metrics_port=args.metrics_port,
                          metrics_address=args.metrics_address,
                          probes_on_decisions=args.probes_on_decisions)
    run_worker(cfg, stop_timeout_s=args.stop_timeout_s, loglevel=args.loglevel)
    return 0


def cmd_decisions(args: argparse.Namespace) -> int:
    from faultwatch.core.diagnosis import is_probe
    from faultwatch.core.events import Decision
    from faultwatch.kafka.reading import read_topic, run_reader
    from faultwatch.render import render_decision
    from faultwatch.wire import decision_to_dict, decode_decision, job_key

    bootstrap = _need_bootstrap(args)
    topic = Topics(args.topic_prefix).decisions
    seen: set[str] = set()

    def emit(item: tuple[Any, Decision]) -> None:
        _, dec = item
        if dec.id in seen:  # decisions are idempotent: show each id once
            return
        if is_probe(dec):  # an older processor's probe (control traffic, not a decision)
            return
        seen.add(dec.id)
        if args.json:
            sys.stdout.write(orjson.dumps(decision_to_dict(dec)).decode() + "\n")
        else:
            sys.stdout.write(render_decision(dec) + "\n")
        sys.stdout.flush()

    key = job_key(args.job) if args.job else None
    return run_reader(read_topic(bootstrap, topic, follow=args.follow, key=key,
                                 decoder=decode_decision), emit)


def cmd_logs(args: argparse.Namespace) -> int:
    from faultwatch.kafka.reading import read_topic, run_reader
    from faultwatch.render import render_line
    from faultwatch.rules.prefix import strip_rank
    from faultwatch.wire import lines_of

    bootstrap = _need_bootstrap(args)
    topic = Topics(args.topic_prefix).logs
    seen: set[tuple[str, str, str, str, int]] = set()
    seen_notes: set[tuple[str, ...]] = set()

    def emit(item: tuple[Any, dict[str, Any]]) -> None:
        _, d = item
        if d.get("job") == args.job and d.get("t") == "note" and d.get("kind") == "bootcheck":
            from faultwatch.nodes.show import emit_check_note  # boot/after-failure checks

            emit_check_note(d, seen_notes, args.json)
            return
        if d.get("job") != args.job or d.get("t") != "lines":
            return
        node, run_id = str(d.get("node")), str(d.get("run_id", ""))
        attempt = str(d.get("attempt"))  # one run id spans attempts: seq restarts with each
        for ln in lines_of(d):
            k = (node, run_id, attempt, ln.stream, ln.seq)
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
    from faultwatch.rules import classify, layers

    ruleset = layers.load(args.rules or ()).ruleset
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
    bootstrap = _need_bootstrap(args)
    topics = Topics(args.topic_prefix)
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
    return rules_show.show_cluster(args.bootstrap, Topics(args.topic_prefix), rule_id=args.rule,
                                   as_json=args.json)


def cmd_rules_diff(args: argparse.Namespace) -> int:
    from faultwatch.streams import rules_show

    return rules_show.diff_main(args.files, current=args.rules,
                                bootstrap=None if _rules_local(args) else args.bootstrap,
                                topics=Topics(args.topic_prefix), as_json=args.json,
                                exit_code=args.exit_code)


def cmd_notify(args: argparse.Namespace) -> int:
    topic = Topics(args.topic_prefix).decisions
    return notify_cli.run(notify_cli.config_of(args, _need_bootstrap(args), topic))


def cmd_status(args: argparse.Namespace) -> int:
    from faultwatch import status

    return status.run(_need_bootstrap(args), Topics(args.topic_prefix).status, job=args.job,
                      as_json=args.json, watch=args.watch, interval_s=args.interval_s)


def cmd_diagnose(args: argparse.Namespace) -> int:
    from faultwatch import diagnosis_request

    return diagnosis_request.run(_need_bootstrap(args), Topics(args.topic_prefix), args.job,
                                 as_json=args.json, timeout_s=args.timeout_s)


def cmd_agent(args: argparse.Namespace) -> int:
    from faultwatch.agents.cli import config_from_args
    from faultwatch.agents.entry import main_sync

    return main_sync(config_from_args(args), flush_only=bool(args.flush))


def cmd_agent_tail(args: argparse.Namespace) -> int:
    from faultwatch.agents.tail import tail_main

    return tail_main(args)


def cmd_agent_bootcheck(args: argparse.Namespace) -> int:
    from faultwatch.agents.bootcheck import bootcheck_main

    return bootcheck_main(args)


def _broker_errors(exc: OSError) -> BrokerError:
    return BrokerError(f"{type(exc).__name__}: {exc}")


def cmd_kafka_up(args: argparse.Namespace) -> int:
    from faultwatch.kafka import broker as kafka_local

    if args.secure:
        from faultwatch.kafka.cli import cmd_up_secure

        return cmd_up_secure(args)
    try:
        print(kafka_local.up(args.port, args.data_dir, args.controller_port), flush=True)
    except OSError as e:
        raise _broker_errors(e) from e
    return EXIT_OK


def cmd_kafka_down(args: argparse.Namespace) -> int:
    from faultwatch.kafka import broker as kafka_local

    try:
        data = kafka_local.status(args.data_dir, args.port)["data_dir"]
        stopped = kafka_local.down(args.data_dir, args.port)
    except OSError as e:
        raise _broker_errors(e) from e
    print(f"stopped the broker of {data}" if stopped else f"no broker running for {data}")
    return EXIT_OK


def cmd_kafka_status(args: argparse.Namespace) -> int:
    from faultwatch.kafka import broker as kafka_local

    try:
        info = kafka_local.status(args.data_dir, args.port)
    except OSError as e:
        raise _broker_errors(e) from e
    if args.json:
        print(json.dumps(info))
    elif info["running"]:
        print(f"running: pid {info['pid']}, bootstrap {info['bootstrap']}, "
              f"data dir {info['data_dir']}")
    else:
        print(f"not running (data dir {info['data_dir']})")
    return EXIT_OK


def cmd_kafka_acls(args: argparse.Namespace) -> int:
    from faultwatch.kafka.cli import cmd_acls

    return cmd_acls(args, _need_bootstrap)


def cmd_kafka_fetch(args: argparse.Namespace) -> int:
    from faultwatch.kafka import broker as kafka_local

    try:
        print(kafka_local.ensure_jars())
    except OSError as e:
        raise _broker_errors(e) from e
    return EXIT_OK


# ---- parser -------------------------------------------------------------------------------

class _Parser(argparse.ArgumentParser):
    """argparse with a hint appended to usage errors (e.g. where the wrapped command goes)."""

    hint = ""

    def error(self, message: str) -> NoReturn:
        self.print_usage(sys.stderr)
        hint = f"\n  hint: {self.hint}" if self.hint else ""
        self.exit(EXIT_USAGE, f"{self.prog}: error: {message}{hint}\n")


AGENT_EPILOG = f"""\
subcommands (instead of -- CMD):
  faultwatch agent tail --job J [--node N] PATH...   ship existing log files
  faultwatch agent bootcheck --job J [...]           run the boot checks now, ship the result

exit codes (never the command's own: that one is in the verdict line, --verdict-out
and the decision; docs/cli.md#exit-codes):
  0 the command succeeded;
  {EXIT_RESTART} restart here (a restart decision with --on-restart exit);
  {EXIT_BLACKLISTED} run me elsewhere: a blacklist decision named this node, or a boot check
      failed with --bootcheck-abort;
  {EXIT_FAILED} a fail decision: permanent;
  {EXIT_UNDECIDED} the command failed and no decision arrived within --decision-wait-s;
  {EXIT_NODES_TIMEOUT} --wait-for-nodes timed out;
  129/130/143 the agent itself got SIGHUP/SIGINT/SIGTERM; 1-6 faultwatch's own errors.
"""


def _add_agent_common(p: argparse.ArgumentParser, job_required: bool) -> None:
    """Flags shared by `agent`, `agent tail` and `agent bootcheck`."""
    _add_kafka_flags(p)
    p.add_argument("--job", required=job_required, default=os.environ.get("FAULTWATCH_JOB"),
                   help="job name (default $FAULTWATCH_JOB)")
    p.add_argument("--node", default=None,
                   help="node name (default $FAULTWATCH_NODE, else the hostname)")
    p.add_argument("--heartbeat-s", type=float, default=2.0,
                   help="heartbeat interval while the child is quiet")
    p.add_argument("--heartbeat-flowing-s", type=float, default=10.0,
                   help="heartbeat interval while the child prints (its lines prove it alive); "
                        "keep it + --heartbeat-s below half the processor's node_lost_s")
    p.add_argument("--run-id", default=None,
                   help="the job run's identity, shared by its agents and attempts (default "
                        "$FAULTWATCH_RUN_ID, else Slurm's job id, torchrun's --rdzv-id, "
                        "$FAULTWATCH_K8S_UID, else generated per agent)")
    p.add_argument("--label", action="append", default=[], metavar="KEY=VALUE",
                   help="a label of the run, sent in its run-start record (repeatable)")
    p.add_argument("--spool-dir", default=None,
                   help="spool root (default $FAULTWATCH_SPOOL_DIR or ~/.faultwatch/spool)")
    p.add_argument("--attempt", type=int, default=None,
                   help="attempt number of the job (default $FAULTWATCH_ATTEMPT or 0)")
    p.add_argument("--exit-flush-timeout-s", type=float, default=10.0,
                   help="how long to wait for acks at exit; the rest stays spooled")
    p.add_argument("--spool-cap-mb", type=int, default=256, help="spool size cap")


def _add_bootcheck_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument("--bootcheck-path", action="append", default=[], metavar="PATH",
                   help="a mount point whose write/read speed to check (repeatable)")
    p.add_argument("--bootcheck-min-mb-s", type=float, default=0.0,
                   help="a path slower than this (MB/s, write or read) fails its check")
    p.add_argument("--bootcheck-expect-gpus", type=int, default=None,
                   help="fail unless torch sees exactly this many GPUs")
    p.add_argument("--bootcheck-allreduce", action=argparse.BooleanOptionalAction,
                   default=True, help="run an all-reduce across the job's nodes (or 2 local "
                   "processes for a 1-node job) and measure its bandwidth")
    p.add_argument("--bootcheck-timeout-s", type=float, default=120.0,
                   help="timeout of each subprocess check (versions, all-reduce)")


def _add_verdict_flags(p: argparse.ArgumentParser) -> None:
    """The exit contract's flags, the same on `run` and `agent` (docs/cli.md#exit-codes)."""
    p.add_argument("--verdict-out", metavar="FILE",
                   help="write the verdict as JSON at exit: verdict, exit code, the command's "
                        "own code and signal, the decision, run id, attempt")
    p.add_argument("--on-restart", choices=ON_RESTART, default="relaunch",
                   help="a restart decision: relaunch the command here (default), or exit "
                        f"{EXIT_RESTART} so a scheduler, a shell loop or torchrun relaunches "
                        "this agent with the next attempt")


def _add_agent(sub: Any) -> None:
    p = sub.add_parser(
        "agent", help="run a command and ship its output, exit and heartbeats to Kafka",
        usage="faultwatch agent [options] -- CMD [ARGS...]\n"
              "       faultwatch agent {tail,bootcheck} ...",
        formatter_class=argparse.RawDescriptionHelpFormatter, epilog=AGENT_EPILOG,
        description="Run CMD, tee its stdout/stderr unchanged, and ship lines, heartbeats and "
                    "its exit to <prefix>logs. Unacked records wait in a disk spool. "
                    "Under torchrun (--no-python) RANK/WORLD_SIZE are picked up from the env. "
                    "See docs/agent.md.")
    p.hint = "the training command goes after --: faultwatch agent --job J -- CMD [ARGS...]"
    _add_agent_common(p, job_required=False)
    p.add_argument("--rank", type=int, default=None, help="rank (default $RANK)")
    p.add_argument("--nnodes", type=int, default=None,
                   help="nodes of the job, sent in RunStart (default from torchrun's env)")
    p.add_argument("--term-grace-s", type=float, default=10.0,
                   help="SIGTERM to SIGKILL escalation when stopping the child")
    p.add_argument("--max-line-bytes", type=int, default=65536)
    p.add_argument("--node-key-file", type=Path, default=None,
                   help="this node's Ed25519 key (`faultwatch keys generate --node NODE`): "
                        "signs what the agent sends, so no other node can speak for this one "
                        "(default $FAULTWATCH_NODE_KEY_FILE; never passed to the child)")
    p.add_argument("--follow-decisions", action=argparse.BooleanOptionalAction,
                   default=None,
                   help="act on <prefix>decisions for the job: restart the child on `restart`, "
                        f"exit {EXIT_BLACKLISTED} on `blacklist` naming this node, stop and exit "
                        f"{EXIT_FAILED} on `fail`; after a failure wait --decision-wait-s for "
                        "the decision; answer the probes of <prefix>control "
                        "(default: $FAULTWATCH_FOLLOW_DECISIONS if set, else on in node mode "
                        "and off in rank mode, where torchrun or the scheduler restarts ranks)")
    p.add_argument("--decision-wait-s", type=float, default=60.0,
                   help="after the child failed, how long to wait for the job's decision "
                        f"(none: exit {EXIT_UNDECIDED})")
    p.add_argument("--decisions-out", metavar="FILE",
                   help="append the job's decisions this agent reads as JSON lines")
    _add_verdict_flags(p)
    p.add_argument("--sdk", action=argparse.BooleanOptionalAction, default=True,
                   help="open a Unix socket for the training SDK ($FAULTWATCH_SDK_SOCKET in "
                        "the child's env) and ship its messages as notes")
    p.add_argument("--wait-for-nodes", type=int, default=0, metavar="N",
                   help="hold the launch until N nodes of the job have an agent up")
    p.add_argument("--wait-for-nodes-timeout-s", type=float, default=900.0,
                   help=f"give up waiting (exit {EXIT_NODES_TIMEOUT}) after this long")
    p.add_argument("--bootcheck", action="store_true",
                   help="run the boot checks before every launch (the first, and each "
                        "relaunch after a failure); ship a bootcheck note")
    p.add_argument("--bootcheck-abort", action="store_true",
                   help=f"a failed boot check aborts the launch (exit {EXIT_BOOTCHECK_FAILED})")
    _add_bootcheck_flags(p)
    p.add_argument("--metrics-port", type=int, default=None,
                   help="serve Prometheus metrics on http://ADDRESS:PORT/metrics")
    p.add_argument("--metrics-address", default="127.0.0.1",
                   help="address /metrics listens on (default 127.0.0.1; 0.0.0.0 or :: for "
                        "every interface); reads time out after 5 s, at most 16 "
                        "connections at once")
    p.add_argument("--flush", action="store_true",
                   help="no command: deliver what an earlier agent left in the spool, exit")
    p.set_defaults(func=cmd_agent)
    asub = p.add_subparsers(dest="agent_command", metavar="{tail,bootcheck}",
                            parser_class=_Parser)

    t = asub.add_parser("tail", help="ship existing log files",
                        description="Ship existing log files (polling; offsets persisted; "
                                    "rotation and truncation handled).")
    _add_agent_common(t, job_required=True)
    t.add_argument("--state-file", default=None,
                   help="offsets (default <spool>/<job>/<node>/tail/state.json)")
    t.add_argument("--poll-s", type=float, default=0.5, help="polling interval")
    t.add_argument("--from-end", action="store_true",
                   help="files without saved offsets start at their end (default: start)")
    t.add_argument("--max-line-bytes", type=int, default=65536)
    t.add_argument("paths", nargs="+", metavar="PATH")
    t.set_defaults(func=cmd_agent_tail)

    b = asub.add_parser("bootcheck", help="run the boot checks now, ship the result",
                        description="Run the boot checks now; print them as JSON and ship a "
                                    "bootcheck note (unless --no-ship).")
    _add_agent_common(b, job_required=True)
    _add_bootcheck_flags(b)
    b.add_argument("--nnodes", type=int, default=None)
    b.add_argument("--no-ship", action="store_true", help="only print the result")
    b.set_defaults(func=cmd_agent_bootcheck)


def _add_kafka(sub: Any) -> None:
    from faultwatch.kafka.broker import CACHE_ENV, KAFKA_VERSION

    kafka = sub.add_parser(
        "kafka", help="run a local single-node Kafka broker without Docker",
        description=f"Run Apache Kafka {KAFKA_VERSION} (KRaft) from Maven Central jars "
                    f"(cached in ${CACHE_ENV} or ~/.cache/faultwatch/kafka-{KAFKA_VERSION}).")
    actions = kafka.add_subparsers(dest="kafka_command", required=True, metavar="ACTION",
                                   parser_class=_Parser)
    start = actions.add_parser("up", help="start the broker; print its bootstrap address")
    stop = actions.add_parser("down", help="stop the broker of a data directory")
    show = actions.add_parser("status", help="show whether the broker runs")
    for p in (start, stop, show):
        p.add_argument("--port", type=int, default=9092, help="broker port (default 9092)")
        p.add_argument("--data-dir", type=Path, default=None,
                       help="broker data directory (default ~/.cache/faultwatch/broker-PORT)")
    start.add_argument("--controller-port", type=int, default=None,
                       help="KRaft controller port (default: previous one, else a free one)")
    start.add_argument("--secure", action="store_true",
                       help="no unauthenticated listener: SASL_SSL (SCRAM-SHA-512) on --port, "
                            "ACLs, one principal per role; writes DATA_DIR/clients/<role>.yaml")
    start.add_argument("--partitions", type=int, default=None,
                       help="with --secure: partitions of the topics it creates")
    from faultwatch.kafka.cli import add_acls_flags, add_scope_flags

    add_scope_flags(start, prefix=True)
    acl = actions.add_parser("acls", help="print (--apply: create) the role ACLs of a prefix")
    _add_kafka_flags(acl)
    add_acls_flags(acl)
    acl.set_defaults(func=cmd_kafka_acls)
    show.add_argument("--json", action="store_true", help="print JSON")
    fetch = actions.add_parser("fetch", help="resolve the broker jars from Maven Central (once)")
    start.set_defaults(func=cmd_kafka_up)
    stop.set_defaults(func=cmd_kafka_down)
    show.set_defaults(func=cmd_kafka_status)
    fetch.set_defaults(func=cmd_kafka_fetch)


def _add_rules(sub: Any) -> None:
    rules = sub.add_parser("rules", help="check, test, try, push, show and diff rule files")
    rsub = rules.add_subparsers(dest="rules_command", required=True, metavar="SUBCOMMAND",
                                parser_class=_Parser)
    p = rsub.add_parser("check", help="validate rule files: path:line: message, all at once")
    p.add_argument("files", nargs="+", metavar="FILE")
    p.set_defaults(func=cmd_rules_check)
    p = rsub.add_parser("test", help="run the inline tests of every rule")
    p.add_argument("files", nargs="*", metavar="FILE")
    p.add_argument("--no-builtin", action="store_true", help="test only the given files")
    p.set_defaults(func=cmd_rules_test)
    p = rsub.add_parser("classify", help="classify a failure log excerpt (one JSON object)")
    _add_rules_flag(p)
    p.add_argument("--exit-code", type=int, default=None, help="the failed process's exit code")
    p.add_argument("--explain", action="store_true", help="also list every rule match")
    p.add_argument("logfile", nargs="?", default="-", help="log file, or - for stdin")
    p.set_defaults(func=cmd_rules_classify)
    p = rsub.add_parser("push", help="validate rule files and publish them to every processor")
    _add_kafka_flags(p)
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
    _add_kafka_flags(p)
    _add_rules_flag(p)
    p.add_argument("--local", action="store_true",
                   help="the local set (embedded mode), even with a bootstrap known")
    p.add_argument("--rule", metavar="ID", help="why this rule is what it is: every layer and "
                                                "file that defined it, the one in force last")
    p.add_argument("--json", action="store_true", help="one JSON object per worker")
    p.set_defaults(func=cmd_rules_show)
    p = rsub.add_parser("diff", help="what rule files change against what runs: the pushed "
                                     "set (a pending push), or the local --rules files")
    _add_kafka_flags(p)
    _add_rules_flag(p)
    p.add_argument("files", nargs="+", metavar="FILE")
    p.add_argument("--local", action="store_true",
                   help="against the local set (built-in + --rules files), not the pushed one")
    p.add_argument("--json", action="store_true", help="the diff as one JSON object")
    p.add_argument("--exit-code", action="store_true",
                   help="exit 1 when the sets differ (like git diff --exit-code)")
    p.set_defaults(func=cmd_rules_diff)


def build_parser() -> argparse.ArgumentParser:
    """The one argparse tree of every `faultwatch` command."""
    parser = _Parser(
        prog="faultwatch",
        description="Watch distributed training jobs' logs; decide restarts, blacklists, fails.",
        epilog="exit codes: docs/cli.md")
    parser.add_argument("--version", action="version", version=f"faultwatch {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND",
                                parser_class=_Parser)

    p = sub.add_parser("run", help="embedded mode: supervise CMD in-process, no Kafka",
                       usage="faultwatch run [options] -- CMD [ARGS...]")
    p.hint = "the training command goes after --: faultwatch run [options] -- CMD [ARGS...]"
    _add_rules_flag(p)
    p.add_argument("--decisions-out", metavar="FILE", help="append decisions as JSON lines")
    p.add_argument("--control-out", metavar="FILE",
                   help="append the control requests (diagnosis probes) as JSON lines")
    p.add_argument("--job", default="local", help="job name used in decisions")
    p.add_argument("--term-grace-s", type=float, default=10.0,
                   help="SIGTERM -> SIGKILL grace when stopping the command")
    p.add_argument("--decision-wait-s", type=float, default=60.0,
                   help="after the command failed, how long to wait for the decision "
                        f"(none: exit {EXIT_UNDECIDED})")
    _add_verdict_flags(p)
    _add_policy_flags(p)
    p.set_defaults(func=cmd_run)

    _add_agent(sub)

    p = sub.add_parser("process", help="cluster mode: run a processor worker (both stages; "
                                       "needs faultwatch[processor])")
    _add_kafka_flags(p)
    _add_rules_flag(p)
    p.add_argument("--partitions", type=int, default=DEFAULT_PARTITIONS,
                   help="partitions of the logs/signals topics and the job table")
    p.add_argument("--app-id", help="consumer group / app id (default '<prefix>processor')")
    p.add_argument("--loglevel", default="warning", help="Faust worker log level")
    p.add_argument("--stop-timeout-s", type=float, default=10.0,
                   help="on SIGTERM/SIGINT, flush and exit within this long (seconds)")
    p.add_argument("--metrics-port", type=int, default=None,
                   help="serve Prometheus metrics on http://ADDRESS:PORT/metrics")
    p.add_argument("--metrics-address", default="127.0.0.1",
                   help="address /metrics listens on (default 127.0.0.1; 0.0.0.0 or :: for "
                        "every interface); reads time out after 5 s, at most 16 "
                        "connections at once")
    p.add_argument("--probes-on-decisions", action="store_true",
                   help="upgrade aid: also publish the diagnosis probes on <prefix>decisions, "
                        "for agents older than <prefix>control (docs/decisions.md)")
    _add_policy_flags(p)
    p.set_defaults(func=cmd_process)

    p = sub.add_parser("notify", help="send decisions to webhooks (Slack, Feishu, DingTalk, "
                       "JSON), grouped like Alertmanager", description="Consume decisions and "
                       "post grouped notifications; see docs/operating.md.")
    _add_kafka_flags(p)
    notify_cli.add_arguments(p)
    p.set_defaults(func=cmd_notify)

    p = sub.add_parser("status", help="the jobs the processors know: run, attempt, ranks "
                       "alive, quietest ranks, stage and window, last decisions")
    _add_kafka_flags(p)
    p.add_argument("--job", help="only this job")
    p.add_argument("--json", action="store_true", help="one JSON snapshot per job, then exit")
    p.add_argument("--watch", "-w", action="store_true", help="a live view until Ctrl-C")
    p.add_argument("--interval-s", type=float, default=2.0, help="refresh interval of --watch")
    p.set_defaults(func=cmd_status)

    p = sub.add_parser("decisions", help="print decisions from the decisions topic")
    _add_kafka_flags(p)
    p.add_argument("--job", help="only this job")
    p.add_argument("--follow", "-f", action="store_true", help="keep reading new decisions")
    p.add_argument("--json", action="store_true", help="one JSON object per line")
    p.set_defaults(func=cmd_decisions)

    p = sub.add_parser("diagnose", help="ask a running job's agents for every rank's stack and "
                                        "Flight Recorder dump; print who waits where (cluster "
                                        "mode; embedded mode does this before every hang)")
    _add_kafka_flags(p)
    p.add_argument("job", help="job id")
    p.add_argument("--json", action="store_true", help="the analysis as one JSON object")
    p.add_argument("--timeout-s", type=float, default=30.0,
                   help="wait this long for the nodes' answers")
    p.set_defaults(func=cmd_diagnose)

    p = sub.add_parser("logs", help="print the shipped lines of a job, all nodes and ranks")
    _add_kafka_flags(p)
    p.add_argument("job", help="job id")
    p.add_argument("--follow", "-f", action="store_true", help="keep reading new lines")
    p.add_argument("--json", action="store_true", help="one JSON object per line")
    p.set_defaults(func=cmd_logs)

    _add_rules(sub)
    _add_kafka(sub)
    from faultwatch.actuate import cli as actuate_cli
    from faultwatch.nodes import cli as nodes_cli
    from faultwatch.trust import cli as keys_cli

    nodes_cli.register(sub)
    actuate_cli.register(sub)
    keys_cli.register(sub)
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
        parser.error(f"unrecognized arguments: {' '.join(unknown)}{hint}")
    args.cmd = cmd
    return args


def main(argv: Sequence[str] | None = None) -> int:
    """The console script: parse, run the command, map every FaultwatchError to its exit code."""
    try:
        args = parse_args(sys.argv[1:] if argv is None else argv)
    except SystemExit as e:  # --help, --version, usage errors (already printed)
        return EXIT_OK if e.code is None else e.code if isinstance(e.code, int) else EXIT_USAGE
    try:
        if hasattr(args, "kafka_config"):  # every Kafka command: SSL/SASL settings, checked
            kafka_settings.configure(kafka_settings.from_args(args))
        return int(args.func(args))
    except FaultwatchError as e:
        print(f"faultwatch: error: {e}", file=sys.stderr)
        return e.exit_code
    except KeyboardInterrupt:
        return EXIT_INTERRUPTED


if __name__ == "__main__":
    sys.exit(main())
