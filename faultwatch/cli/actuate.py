"""`faultwatch actuate --backend slurm|kubernetes|exec`: make a scheduler act on decisions and
the node registry; argument parsing and start-up."""

from __future__ import annotations

import argparse
import asyncio
import signal
from pathlib import Path
from typing import Any

from faultwatch.actuate import plugins
from faultwatch.actuate.limits import ActuateLimits
from faultwatch.cli import options
from faultwatch.core.registry import RegistryPolicy
from faultwatch.errors import ConfigError
from faultwatch.wire.topics import actuate_group

BACKENDS = plugins.names()


def build_backend(args: argparse.Namespace) -> Any:
    """The chosen plug-in, built from its own options' values."""
    return plugins.build(args.backend, vars(args))


def cmd_actuate(args: argparse.Namespace) -> int:
    from faultwatch.actuate.limits import ActuateLimits
    from faultwatch.actuate.runner import ActuateConfig
    from faultwatch.actuate.service import run_until_stopped
    from faultwatch.core.registry import RegistryPolicy
    from faultwatch.eventlog import set_component
    from faultwatch.trust.replay import max_age_s

    set_component("actuate")
    state = Path(args.state_file or Path.home() / ".faultwatch" /
                 f"actuate-{args.backend}.jsonl")
    if args.release_hold:
        return release_hold(state)
    bootstrap = options.need_bootstrap(args)
    backend = build_backend(args)
    try:
        limits = ActuateLimits(max_drains_per_window=args.max_drains_per_window,
                               window_s=args.drain_window_s,
                               max_drained_share=args.max_drained_share)
    except ValueError as e:
        raise ConfigError("actuate", str(e)) from None
    cfg = ActuateConfig(bootstrap=bootstrap, prefix=args.topic_prefix, state_file=state,
                        group=args.group or actuate_group(args.topic_prefix, args.backend),
                        write_registry=args.registry_writer,
                        max_decision_age_s=max_age_s(args.max_decision_age_s),
                        registry_policy=RegistryPolicy(quarantine_s=args.quarantine_s),
                        limits=limits, fleet_nodes=args.fleet_nodes)
    options.serve_service_metrics(args, "actuate")

    async def main() -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        await run_until_stopped(backend, cfg, stop)

    from faultwatch.kafka.errors import BROKER_ERRORS, broker_error

    try:
        asyncio.run(main())
    except BROKER_ERRORS as e:  # the journal makes a restart (systemd, Deployment) safe
        raise broker_error(e, bootstrap, "actuating decisions") from None
    return 0


def release_hold(state: Path) -> int:
    """Ask the actuator running with `state` to release its hold (it runs the held drains
    within a poll interval, then counts afresh); prints what was held."""
    from faultwatch.actuate.runner import hold_file, release_file

    held = hold_file(state)
    if not held.exists():
        print(f"no hold: {held} does not exist (nothing is held by the actuator with "
              f"--state-file {state})")
        return 0
    print(held.read_text().strip())
    release_file(state).touch()
    print(f"released: the actuator runs the held actions within a second ({release_file(state)})")
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
    p.add_argument("--quarantine-s", type=float,
                   default=options.default_of(RegistryPolicy, "quarantine_s"),
                   help="first quarantine of a node (default %(default)g; doubles per "
                        "repeat, capped at 7 days)")
    g = p.add_argument_group("limits (Kubernetes' --node-eviction-rate and "
                             "--unhealthy-zone-threshold are the anchor; see docs/operating.md)")
    g.add_argument("--max-drains-per-window", type=int,
                   default=options.default_of(ActuateLimits, "max_drains_per_window"),
                   help="drain/taint at most this many nodes per --drain-window-s (default "
                        "%(default)s)")
    g.add_argument("--drain-window-s", type=float,
                   default=options.default_of(ActuateLimits, "window_s"),
                   help="the window of --max-drains-per-window (default %(default)g)")
    g.add_argument("--max-drained-share", type=float,
                   default=options.default_of(ActuateLimits, "max_drained_share"),
                   help="never more than this share of the nodes on the registry drained at "
                        f"once, but always {options.default_of(ActuateLimits, 'min_drained_nodes')}"
                        " nodes (default %(default)g)")
    g.add_argument("--fleet-nodes", type=int, default=0,
                   help="nodes in the fleet, for --max-drained-share (default: the nodes on "
                        "the registry, which lists only nodes that ever had a record)")
    g.add_argument("--release-hold", action="store_true",
                   help="release the hold of the actuator running with this --state-file "
                        "(or --backend's default) and exit: the held drains run")
    options.add_max_decision_age(p)
    for plugin in plugins.plugins().values():  # each backend's own options, as it declares
        options.add_plugin_options(p.add_argument_group(plugin.TITLE), plugin.OPTIONS)
    options.add_metrics(p)
    options.add_logging(p)
    p.set_defaults(func=cmd_actuate)
    return p
