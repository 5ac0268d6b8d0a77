"""`faultwatch status`: the jobs the processors know (their status snapshots)."""

from __future__ import annotations

import argparse
from typing import Any

from faultwatch.cli import options


def cmd_status(args: argparse.Namespace) -> int:
    from faultwatch.errors import UsageError
    from faultwatch.readers.status import show

    if args.job_arg is not None and args.job is not None and args.job_arg != args.job:
        raise UsageError(f"two jobs named: {args.job_arg!r} and --job {args.job!r}")
    if args.finished_for_s < 0:
        raise UsageError(f"--finished-for-s {args.finished_for_s}: must be 0 or more")
    return show(options.need_bootstrap(args), options.topics(args).status,
                job=args.job_arg or args.job, as_json=args.json, watch=args.watch,
                interval_s=args.interval_s, wide=args.wide, finished_for_s=args.finished_for_s,
                holds_topic=options.topics(args).holds)


def register(sub: Any) -> None:
    p = sub.add_parser("status", help="the jobs the processors know: run, attempt, ranks "
                       "alive, quietest ranks, stage and window, last decisions")
    from faultwatch.readers.status import FINISHED_FOR_S

    options.add_kafka(p)
    p.add_argument("job_arg", nargs="?", metavar="JOB",
                   help="only this job (exit 7 if no processor reports it)")
    p.add_argument("--job", help="the same as JOB")
    p.add_argument("--wide", action="store_true",
                   help="every column in full (default: fit the terminal, 80 columns in a pipe)")
    p.add_argument("--finished-for-s", type=float, default=FINISHED_FOR_S,
                   help="list finished (decided, done) jobs this long after their last "
                        f"snapshot (default {FINISHED_FOR_S:g} s)")
    options.add_json(p, "one JSON snapshot per job, then exit")
    p.add_argument("--watch", "-w", action="store_true", help="a live view until Ctrl-C")
    p.add_argument("--interval-s", type=float, default=2.0, help="refresh interval of --watch")
    p.set_defaults(func=cmd_status)
