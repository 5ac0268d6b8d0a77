"""`faultwatch decisions` and `faultwatch logs`: read the decisions and logs topics back."""

from __future__ import annotations

import argparse
import time
from typing import Any

from faultwatch.cli import options
from faultwatch.core.events import ACTIONS


def _when(args: argparse.Namespace, now: float) -> tuple[float | None, float | None]:
    from faultwatch.readers.select import parse_when

    return (None if args.since is None else parse_when(args.since, now, "--since"),
            None if args.until is None else parse_when(args.until, now, "--until"))


def cmd_decisions(args: argparse.Namespace) -> int:
    from faultwatch.readers.decisions import print_decisions
    from faultwatch.readers.select import DecisionFilter, str_set

    since, until = _when(args, time.time())
    filt = DecisionFilter(job=args.job, actions=str_set(args.action), kinds=str_set(args.kind),
                          since=since, until=until)
    topics = options.topics(args)
    return print_decisions(options.need_bootstrap(args), topics.decisions, filt=filt,
                           follow=args.follow, as_json=args.json, status_topic=topics.status)


def cmd_logs(args: argparse.Namespace) -> int:
    from faultwatch.errors import UsageError
    from faultwatch.readers.logs import LogsQuery, show_logs
    from faultwatch.readers.select import LogFilter, grep_pattern, int_set, str_set

    since, until = _when(args, time.time())
    if args.tail is not None and args.tail < 0:
        raise UsageError(f"--tail {args.tail}: must be 0 or more")
    if args.reorder_window_s < 0:
        raise UsageError(f"--reorder-window-s {args.reorder_window_s}: must be 0 or more")
    filt = LogFilter(nodes=str_set(args.node), ranks=int_set(args.rank, "--rank"),
                     attempts=int_set(args.attempt, "--attempt"), run_id=args.run,
                     streams=str_set(args.stream), since=since, until=until,
                     grep=grep_pattern(args.grep))
    topics = options.topics(args)
    return show_logs(options.need_bootstrap(args), topics.logs, topics.decisions,
                     LogsQuery(args.job, filt, follow=args.follow, tail=args.tail,
                               as_json=args.json, window_s=args.reorder_window_s))


def register(sub: Any) -> None:
    from faultwatch.readers.merge import REORDER_WINDOW_S

    p = sub.add_parser("decisions", help="print decisions from the decisions topic")
    options.add_kafka(p)
    p.add_argument("--job", help="only this job")
    p.add_argument("--action", action="append", choices=ACTIONS,
                   help="only decisions with this action (repeatable)")
    p.add_argument("--kind", action="append", metavar="KIND",
                   help="only decisions of this kind: error, exit, hang, exit-hang, node-lost, "
                        "slow, ... (repeatable, or comma-separated)")
    options.add_time_range(p)
    p.add_argument("--follow", "-f", action="store_true",
                   help="keep reading new decisions (waits for the topic to exist)")
    options.add_json(p)
    p.set_defaults(func=cmd_decisions)

    p = sub.add_parser("logs", help="print the shipped lines of a job, all nodes and ranks in "
                       "time order, with attempt separators and decisions")
    options.add_kafka(p)
    p.add_argument("job", help="job id")
    p.add_argument("--node", action="append", metavar="NODE",
                   help="only this node's lines (repeatable, or comma-separated)")
    p.add_argument("--rank", action="append", metavar="RANK",
                   help="only this rank's lines (repeatable, or comma-separated)")
    p.add_argument("--attempt", action="append", metavar="N",
                   help="only this attempt (repeatable, or comma-separated)")
    p.add_argument("--run", metavar="RUN_ID", help="only this run (the agent's run id)")
    p.add_argument("--stream", action="append", choices=("stdout", "stderr"),
                   help="only this stream's lines")
    options.add_time_range(p)
    p.add_argument("--grep", metavar="REGEX",
                   help="only lines matching REGEX (Python syntax; separators still shown)")
    p.add_argument("--tail", type=int, metavar="N",
                   help="only the last N rows (with -f: then follow)")
    p.add_argument("--reorder-window-s", type=float, default=REORDER_WINDOW_S,
                   help="the bound of the time order across nodes (default "
                        f"{REORDER_WINDOW_S:g} s; docs/cli.md)")
    p.add_argument("--follow", "-f", action="store_true",
                   help="keep reading new lines (waits for the topic to exist)")
    options.add_json(p, "one JSON object per line, the same fields on each (docs/cli.md)")
    p.set_defaults(func=cmd_logs)
