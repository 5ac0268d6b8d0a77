"""`faultwatch diagnose JOB`: ask a running job's agents for stacks and Flight Recorder dumps."""

from __future__ import annotations

import argparse
from typing import Any

from faultwatch.cli import options


def cmd_diagnose(args: argparse.Namespace) -> int:
    from faultwatch.readers.diagnose import run

    return run(options.need_bootstrap(args), options.topics(args), args.job,
               as_json=args.json, timeout_s=args.timeout_s)


def register(sub: Any) -> None:
    p = sub.add_parser("diagnose", help="ask a running job's agents for every rank's stack and "
                                        "Flight Recorder dump; print who waits where (cluster "
                                        "mode; embedded mode does this before every hang)")
    options.add_kafka(p)
    p.add_argument("job", help="job id")
    options.add_json(p, "the analysis as one JSON object")
    p.add_argument("--timeout-s", type=float, default=30.0,
                   help="wait this long for the nodes' answers")
    p.set_defaults(func=cmd_diagnose)
