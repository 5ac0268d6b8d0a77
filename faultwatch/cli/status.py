"""`faultwatch status`: the jobs the processors know (their status snapshots)."""

from __future__ import annotations

import argparse
from typing import Any

from faultwatch.cli import options


def cmd_status(args: argparse.Namespace) -> int:
    from faultwatch.readers.status import show

    return show(options.need_bootstrap(args), options.topics(args).status, job=args.job,
                as_json=args.json, watch=args.watch, interval_s=args.interval_s)


def register(sub: Any) -> None:
    p = sub.add_parser("status", help="the jobs the processors know: run, attempt, ranks "
                       "alive, quietest ranks, stage and window, last decisions")
    options.add_kafka(p)
    p.add_argument("--job", help="only this job")
    options.add_json(p, "one JSON snapshot per job, then exit")
    p.add_argument("--watch", "-w", action="store_true", help="a live view until Ctrl-C")
    p.add_argument("--interval-s", type=float, default=2.0, help="refresh interval of --watch")
    p.set_defaults(func=cmd_status)
