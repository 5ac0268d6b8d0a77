"""`faultwatch describe JOB`: one job in one view (like `kubectl describe`, `scontrol show
job`): run, attempts, nodes, the window in force and why, holds, decisions, refusals."""

from __future__ import annotations

import argparse
from typing import Any

from faultwatch.cli import options


def cmd_describe(args: argparse.Namespace) -> int:
    from faultwatch.readers.describe import describe

    return describe(options.need_bootstrap(args), options.topics(args), args.job, args.json)


def register(sub: Any) -> None:
    p = sub.add_parser("describe", help="one job in full: run, attempts, nodes, quiet ranks, "
                                        "window and why, holds, decisions, refusals",
                       description="Everything the processors, decisions, holds and control "
                                   "topics say of one job, like `kubectl describe` or "
                                   "`scontrol show job` (exit 7 when none knows it). "
                                   "Example: faultwatch describe llama-7b")
    options.add_kafka(p)
    p.add_argument("job", metavar="JOB", help="the job")
    options.add_json(p, "one JSON object: status, holds, runs, decisions, refusals")
    p.set_defaults(func=cmd_describe)
