"""`faultwatch decisions` and `faultwatch logs`: read the decisions and logs topics back."""

from __future__ import annotations

import argparse
from typing import Any

from faultwatch.cli import options


def cmd_decisions(args: argparse.Namespace) -> int:
    from faultwatch.readers.decisions import print_decisions

    return print_decisions(options.need_bootstrap(args), options.topics(args).decisions,
                           job=args.job, follow=args.follow, as_json=args.json)


def cmd_logs(args: argparse.Namespace) -> int:
    from faultwatch.readers.logs import print_logs

    return print_logs(options.need_bootstrap(args), options.topics(args).logs, args.job,
                      follow=args.follow, as_json=args.json)


def register(sub: Any) -> None:
    p = sub.add_parser("decisions", help="print decisions from the decisions topic")
    options.add_kafka(p)
    p.add_argument("--job", help="only this job")
    p.add_argument("--follow", "-f", action="store_true",
                   help="keep reading new decisions (waits for the topic to exist)")
    options.add_json(p)
    p.set_defaults(func=cmd_decisions)

    p = sub.add_parser("logs", help="print the shipped lines of a job, all nodes and ranks")
    options.add_kafka(p)
    p.add_argument("job", help="job id")
    p.add_argument("--follow", "-f", action="store_true",
                   help="keep reading new lines (waits for the topic to exist)")
    options.add_json(p)
    p.set_defaults(func=cmd_logs)
