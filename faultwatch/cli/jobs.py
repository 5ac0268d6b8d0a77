"""`faultwatch jobs`: list the operators' holds and mutes of jobs; `jobs hold|mute JOB --for D
--reason R` sets one (signed like every operator record), `jobs release|unmute JOB` ends it
(core/holds.py says what each does)."""

from __future__ import annotations

import argparse
import time
import uuid
from typing import Any

import orjson

from faultwatch.cli import options
from faultwatch.core.holds import HOLD, MAX_HOLD_S, MUTE, Hold, duration_text, new_hold, released
from faultwatch.errors import ConfigError, NotFoundError

ENDS = {"release": HOLD, "unmute": MUTE}


def _job(name: str) -> str:
    from faultwatch.core.names import name_problem

    why = name_problem(name)
    if why is not None:
        raise ConfigError("JOB", f"{name!r}: {why}")
    return name


def _write(args: argparse.Namespace, hold: Hold, action: str) -> Any:
    """Check that the processors would take it (exit 8 otherwise), sign, write."""
    from faultwatch.holds.store import write_hold
    from faultwatch.rollout.write_check import check_operator_write
    from faultwatch.trust.keys import load_signing_key
    from faultwatch.trust.records import HOLD as PURPOSE
    from faultwatch.trust.records import signer_for

    bootstrap, topics = options.need_bootstrap(args), options.topics(args)
    key = load_signing_key(getattr(args, "signing_key_file", None))
    check_operator_write(bootstrap, topics.status, PURPOSE, key, f"jobs {action}")
    write_hold(bootstrap, topics.holds, hold, signer_for(PURPOSE, key))
    return key


def cmd_set(args: argparse.Namespace) -> int:
    from faultwatch.cli.nodes import parse_duration_s
    from faultwatch.holds.store import read_holds
    from faultwatch.rollout.rules_record import author

    kind = HOLD if args.jobs_command == "hold" else MUTE
    job = _job(args.job)
    duration = parse_duration_s(args.duration)
    if duration > MAX_HOLD_S:
        raise ConfigError("--for", f"{args.duration} is longer than {MAX_HOLD_S / 86400:g} "
                                   "days: set a shorter one and renew it before it ends")
    # built on the job's last record of this kind, so followers order them by version
    last = read_holds(options.need_bootstrap(args), options.topics(args).holds).holds.get(
        (kind, job))
    try:
        h = new_hold(kind, job, time.time(), duration, args.reason, author(),
                     uuid.uuid4().hex[:12], last)
    except ValueError as e:
        raise ConfigError("--reason", str(e)) from None
    key = _write(args, h, args.jobs_command)
    verb = "held (no restart, blacklist or fail is acted on)" if kind == HOLD \
        else "muted (notify posts nothing about it)"
    print(f"job {job} {verb} for {duration_text(duration)}, until "
          f"{time.strftime('%Y-%m-%dT%H:%M:%SZ', time.gmtime(h.until))}, by {h.by}: "
          f"{h.reason}" + (f"; signed by key {key.key_id}" if key else "; unsigned"))
    return 0


def cmd_end(args: argparse.Namespace) -> int:
    from faultwatch.holds.store import read_holds
    from faultwatch.rollout.rules_record import author

    kind = ENDS[args.jobs_command]
    job = _job(args.job)
    now = time.time()
    table = read_holds(options.need_bootstrap(args), options.topics(args).holds)
    h = table.get(kind, job, now)
    if h is None:
        last = table.holds.get((kind, job))
        raise NotFoundError(f"job {job} has no {kind} in force"
                            + (f" ({last.describe(now)})" if last is not None else ""))
    end = released(h, now, author(), args.reason)
    key = _write(args, end, args.jobs_command)
    print(f"job {job}: {kind} by {h.by} ended by {end.by}"
          + (f"; signed by key {key.key_id}" if key else "; unsigned"))
    return 0


def cmd_list(args: argparse.Namespace) -> int:
    from faultwatch.holds.store import read_holds

    now = time.time()
    table = read_holds(options.need_bootstrap(args), options.topics(args).holds)
    shown = sorted(table.holds.values(), key=lambda h: (h.job, h.kind)) if args.all \
        else table.in_force(now)
    if args.json:
        for h in shown:
            print(orjson.dumps({**h.to_dict(), "in_force": h.in_force(now)}).decode())
        return 0
    if not shown:
        print("no job is held or muted" + ("" if args.all else " (--all: ended ones too)"))
    for h in shown:
        print(f"{h.job}  {h.kind}  {h.describe(now)}")
    return 0


def _signing_key_flag(p: argparse.ArgumentParser) -> None:
    options.add_signing_key_file(p, default=argparse.SUPPRESS)


def register(sub: Any) -> argparse.ArgumentParser:
    """Add `jobs` (list, hold, mute, release, unmute) to the top-level CLI's subparsers."""
    p: argparse.ArgumentParser = sub.add_parser(
        "jobs", help="hold or mute one job (like scontrol hold, amtool silence): list, hold, "
                     "mute, release, unmute",
        description="Operators' holds and mutes of jobs, on <prefix>holds. A held job's "
                    "restart, blacklist and fail decisions are published as notices and not "
                    "acted on; a muted job's decisions are acted on, but notify posts nothing. "
                    "Example: faultwatch jobs hold llama-7b --for 2h --reason debugging")
    options.add_kafka(p)
    options.add_json(p, "one JSON object per hold or mute")
    p.add_argument("--all", action="store_true", help="ended and released ones too")
    p.set_defaults(func=cmd_list, jobs_command="list")
    jsub = options.subcommands(p, "jobs_command", metavar="SUBCOMMAND")
    for name, what in (("hold", "act on none of JOB's restart/blacklist/fail decisions "
                                "(they become notices) for a while"),
                       ("mute", "post no notification about JOB for a while")):
        q = jsub.add_parser(name, help=what)
        options.add_kafka(q, sub=True)
        _signing_key_flag(q)
        q.add_argument("job", metavar="JOB")
        q.add_argument("--for", dest="duration", required=True, metavar="DURATION",
                       help=f"how long: 30m, 2h, 1d (at most {MAX_HOLD_S / 86400:g} days)")
        q.add_argument("--reason", required=True, help="why (shown in status and describe)")
        q.set_defaults(func=cmd_set)
    for name, kind in ENDS.items():
        q = jsub.add_parser(name, help=f"end JOB's {kind} now")
        options.add_kafka(q, sub=True)
        _signing_key_flag(q)
        q.add_argument("job", metavar="JOB")
        q.add_argument("--reason", default="", help="why (kept in the record)")
        q.set_defaults(func=cmd_end)
    return p
