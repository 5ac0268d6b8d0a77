"""`faultwatch report`: a job's incidents and goodput, or the fleet's, from the run ledgers."""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import Any

from faultwatch.cli import options
from faultwatch.errors import EXIT_OK, UsageError


def cmd_report(args: argparse.Namespace) -> int:
    from faultwatch.core.policy import Policy
    from faultwatch.readers import report
    from faultwatch.readers.select import parse_when

    if args.fleet == bool(args.job):
        raise UsageError("name a JOB, or pass --fleet (not both)")
    if args.html and args.fleet:
        raise UsageError("--html draws one job's report: name a JOB")
    now = time.time()
    since = None if args.since is None else parse_when(args.since, now, "--since")
    files = list(args.from_file or ())
    runs, acted = report.load(None if files else options.need_bootstrap(args),
                              options.topics(args), files)
    policy = Policy()  # the lemon rule's defaults (a rule file's policy: docs/goodput.md)
    latest = max((led.last_ts or 0.0 for _rec, led in runs.values()), default=now)
    lemons = report.lemon_watch(runs, policy, max(now if not files else latest, latest))
    if args.fleet:
        rep = report.fleet_report(runs, since, lemons, now if not files else latest)
        print(json.dumps(rep) if args.json else report.render_fleet(rep))
        return EXIT_OK
    rep = report.job_report(report.pick(runs, args.job, args.run), acted, lemons, now)
    if args.html:
        from faultwatch.readers.report_html import render_html

        Path(args.html).write_text(render_html(rep), encoding="utf-8")
    print(json.dumps(rep) if args.json else report.render_job(rep))
    return EXIT_OK


def register(sub: Any) -> None:
    p = sub.add_parser("report", help="a job's incidents and goodput (or the fleet's): where "
                       "the wall time went, what each failure cost, lemon nodes")
    options.add_kafka(p)
    p.add_argument("job", nargs="?", metavar="JOB", help="the job (its latest run unless --run)")
    p.add_argument("--run", metavar="RUN_ID", help="this run of JOB")
    p.add_argument("--fleet", action="store_true",
                   help="every run's figures together: ETTR, badput by cause, MTTF by cause, "
                        "time to recover p50/p95, incidents per 1,000 node-hours, lemon nodes")
    p.add_argument("--since", metavar="WHEN",
                   help="--fleet: the runs active at or after WHEN (7d, 12h, an ISO 8601 time, "
                        "Unix seconds)")
    p.add_argument("--from", dest="from_file", action="append", metavar="FILE",
                   help="read `faultwatch run --incidents-out` files instead of Kafka "
                        "(repeatable)")
    p.add_argument("--html", metavar="FILE",
                   help="also write one self-contained HTML page (timeline, step rate, "
                        "badput chart, incidents; nothing loaded from the network)")
    options.add_json(p, "the report as one JSON object")
    p.set_defaults(func=cmd_report)
