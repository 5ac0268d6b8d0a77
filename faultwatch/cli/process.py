"""`faultwatch process`: a processor worker (matcher and job stages, Faust; cluster mode)."""

from __future__ import annotations

import argparse
import importlib.util
from typing import Any

from faultwatch import settings
from faultwatch.actuate import kubernetes
from faultwatch.cli import options
from faultwatch.core.membership import ASK_TIMEOUT_S
from faultwatch.errors import MissingExtraError
from faultwatch.wire.topics import DEFAULT_PARTITIONS


def require_extra(extra: str, command: str, module: str) -> None:
    """Fail with MissingExtraError when `module` (of the `extra` extra) is not installed."""
    if importlib.util.find_spec(module) is None:
        raise MissingExtraError(extra, command, module)


def cmd_process(args: argparse.Namespace) -> int:
    require_extra("processor", "process", "faust")  # the node side installs without Faust
    from faultwatch.eventlog import set_component
    from faultwatch.rules import layers
    from faultwatch.streams.faust_app import ProcessorConfig
    from faultwatch.streams.worker import run_worker

    set_component("process")
    from faultwatch.metrics import check_address_file

    check_address_file(args.metrics_address_file, args.metrics_port)
    from faultwatch.streams import allocations
    from faultwatch.trust.replay import max_age_s

    checker = allocations.from_args(args)
    overrides = options.policy_overrides(args)
    rules = layers.load(args.rules or (), flags=overrides)
    cfg = ProcessorConfig(bootstrap=options.need_bootstrap(args), ruleset=rules.ruleset,
                          policy=rules.policy, rules=rules,
                          topics=options.topics(args), partitions=args.partitions,
                          app_id=args.app_id or "", policy_overrides=overrides,
                          metrics_port=args.metrics_port,
                          metrics_address=args.metrics_address,
                          metrics_address_file=args.metrics_address_file,
                          probes_on_decisions=args.probes_on_decisions,
                          allocations=checker,
                          max_decision_age_s=max_age_s(args.max_decision_age_s))
    run_worker(cfg, stop_timeout_s=args.stop_timeout_s, loglevel=args.loglevel)
    return 0


def register(sub: Any) -> None:
    p = sub.add_parser("process", help="cluster mode: run a processor worker (both stages; "
                                       "needs faultwatch[processor])")
    options.add_kafka(p)
    options.add_rules(p)
    p.add_argument("--partitions", type=int, default=DEFAULT_PARTITIONS,
                   help="partitions of the logs/signals topics and the job table")
    p.add_argument("--app-id", help="consumer group / app id (default '<prefix>processor')")
    p.add_argument("--loglevel", default="warning", help="Faust worker log level")
    p.add_argument("--stop-timeout-s", type=float, default=10.0,
                   help="on SIGTERM/SIGINT, flush and exit within this long (seconds)")
    options.add_metrics(p)
    p.add_argument("--probes-on-decisions", action="store_true",
                   help="upgrade aid: also publish the diagnosis probes on <prefix>decisions, "
                        "for agents older than <prefix>control (docs/decisions.md)")
    p.add_argument("--max-decision-age-s", type=float, default=None,
                   help=f"publish no decision whose evidence is older than this (default "
                        f"${settings.MAX_DECISION_AGE_S}, else "
                        f"{settings.MAX_DECISION_AGE_S.fallback:g} s; the consumers' replay "
                        "rule: docs/decisions.md)")
    g = p.add_argument_group(
        "membership (docs/operating.md: a node may only speak for jobs the scheduler "
        "placed on it)")
    g.add_argument("--allocation-check", choices=("slurm", "kubernetes", "exec"),
                   help="ask the scheduler which nodes a job holds and refuse records of "
                        "other nodes about it (default: not asked)")
    g.add_argument("--allocation-exec", metavar="JSON",
                   help="with --allocation-check exec: a JSON argv list with {kind} {job_id} "
                        "{namespace} {uid} {pod}; prints the job's nodes and exits 0, exit 1 "
                        "when the scheduler runs no such job")
    g.add_argument("--allocation-timeout-s", type=float, default=ASK_TIMEOUT_S,
                   help="one question to the scheduler (default: %(default)s)")
    g.add_argument("--scontrol", default="scontrol", help="scontrol executable (slurm)")
    options.add_plugin_options(g, kubernetes.CONNECTION)  # the actuator's, as it declares
    options.add_logging(p)
    options.add_policy(p)
    p.set_defaults(func=cmd_process)
