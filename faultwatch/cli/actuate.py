"""`faultwatch actuate --backend slurm|kubernetes|exec`: make a scheduler act on decisions and
the node registry; argument parsing and start-up."""

from __future__ import annotations

import argparse
import asyncio
import signal
from pathlib import Path
from typing import Any

from faultwatch.cli import options

BACKENDS = ("slurm", "kubernetes", "exec")


def build_backend(args: argparse.Namespace) -> Any:
    if args.backend == "slurm":
        from faultwatch.actuate import slurm

        return slurm.from_args(args)
    if args.backend == "kubernetes":
        from faultwatch.actuate import kubernetes

        return kubernetes.from_args(args)
    from faultwatch.actuate import exec as exec_backend

    return exec_backend.from_args(args)


def cmd_actuate(args: argparse.Namespace) -> int:
    from faultwatch.actuate.runner import ActuateConfig, run
    from faultwatch.core.registry import RegistryPolicy
    from faultwatch.eventlog import set_component

    set_component("actuate")
    bootstrap = options.need_bootstrap(args)
    backend = build_backend(args)
    state = Path(args.state_file or Path.home() / ".faultwatch" /
                 f"actuate-{args.backend}.jsonl")
    cfg = ActuateConfig(bootstrap=bootstrap, prefix=args.topic_prefix, state_file=state,
                        group=args.group or f"{args.topic_prefix}actuate-{args.backend}",
                        write_registry=args.registry_writer,
                        max_decision_age_s=args.max_decision_age_s,
                        registry_policy=RegistryPolicy(quarantine_s=args.quarantine_s))

    async def main() -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        await run(backend, cfg, stop)

    from faultwatch.kafka.errors import BROKER_ERRORS, broker_error

    try:
        asyncio.run(main())
    except BROKER_ERRORS as e:  # the journal makes a restart (systemd, Deployment) safe
        raise broker_error(e, bootstrap, "actuating decisions") from None
    return 0


def register(sub: Any) -> argparse.ArgumentParser:
    """Add `actuate` to the top-level CLI's subparsers."""
    p: argparse.ArgumentParser = sub.add_parser(
        "actuate", help="make a scheduler act on decisions and the node registry",
        description="Consume <prefix>decisions and <prefix>nodes; drain/taint quarantined "
                    "nodes, requeue jobs off them, resume released nodes. Dedupes by "
                    "decision id; a state file makes restarts safe. See docs/schedulers.md.")
    p.add_argument("--backend", choices=BACKENDS, required=True)
    options.add_kafka(p)
    p.add_argument("--state-file", help="journal of actions done (default "
                                        "~/.faultwatch/actuate-<backend>.jsonl)")
    p.add_argument("--group", help="consumer group (default <prefix>actuate-<backend>)")
    p.add_argument("--registry-writer", action=argparse.BooleanOptionalAction, default=False,
                   help="also write the node registry from blacklist decisions (off: the "
                        "processor's job stage writes it; on only for decisions no "
                        "processor of this prefix makes, e.g. published by another tool)")
    p.add_argument("--quarantine-s", type=float, default=1800.0,
                   help="first quarantine of a node (doubles per repeat, capped at 7 days)")
    p.add_argument("--max-decision-age-s", type=float, default=600.0,
                   help="ignore decisions older than this (a first start on an old topic)")
    g = p.add_argument_group("slurm")
    g.add_argument("--scontrol", default="scontrol", help="scontrol executable")
    g.add_argument("--squeue", default="squeue", help="squeue executable")
    g = p.add_argument_group("kubernetes (default: in-cluster service account)")
    g.add_argument("--k8s-server", help="API server URL (default: in-cluster)")
    g.add_argument("--k8s-token-file", help="bearer token file")
    g.add_argument("--k8s-ca-file", help="CA bundle of the API server")
    g.add_argument("--k8s-pod-selector",
                   help="also move every pod on the node matching this label selector; "
                        "{job} is the faultwatch job, e.g. training.kubeflow.org/job-name={job}")
    g.add_argument("--k8s-pod-action", choices=("evict", "delete"), default="evict",
                   help="how a pod leaves a quarantined node: the Eviction API, which respects "
                        "PodDisruptionBudgets (a refusal is retried), or a plain delete "
                        "(default: %(default)s)")
    g = p.add_argument_group("exec (JSON argv lists; placeholders {node} {decision} {rule} "
                             "{job} {job_id} {namespace} {pod} {kind})")
    g.add_argument("--exec-quarantine", metavar="JSON")
    g.add_argument("--exec-release", metavar="JSON")
    g.add_argument("--exec-requeue", metavar="JSON")
    p.set_defaults(func=cmd_actuate)
    return p
