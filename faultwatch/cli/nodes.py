"""`faultwatch nodes`: list the fleet-wide node registry, quarantine and release nodes."""

from __future__ import annotations

import argparse
import os
import re
import uuid
from typing import Any

import orjson

from faultwatch.cli import options
from faultwatch.core.registry import (
    NodeRecord,
    Reason,
    RegistryPolicy,
    quarantine,
    release,
)
from faultwatch.errors import ConfigError
from faultwatch.readers.nodes import node_json
from faultwatch.registry.names import valid_node


def parse_duration_s(text: str) -> float:
    """'90', '90s', '30m', '2h', '1d', '1h30m' -> seconds (> 0): readers.select.span_s, the
    one duration grammar, or plain seconds."""
    from faultwatch.readers.select import span_s

    total = span_s(text)
    if total is None:
        t = text.strip()
        if not re.fullmatch(r"\d+(?:\.\d+)?", t):
            raise ConfigError("--for", f"not a duration: {text!r} (e.g. 90s, 30m, 2h, 1d)")
        total = float(t)
    if total <= 0:
        raise ConfigError("--for", f"duration must be positive: {text!r}")
    return total


def _topic(args: argparse.Namespace) -> tuple[str, str]:
    from faultwatch.wire.topics import Topics

    return options.need_bootstrap(args), Topics(args.topic_prefix).nodes


def cmd_nodes(args: argparse.Namespace) -> int:
    from faultwatch.readers.nodes import print_nodes

    bootstrap, topic = _topic(args)
    return print_nodes(bootstrap, topic, as_json=args.json)


def _change(args: argparse.Namespace, make: Any, must_exist: str | None = None) -> int:
    from faultwatch.eventlog import log_event
    from faultwatch.registry.manual import change_node
    from faultwatch.rollout.write_check import check_operator_write
    from faultwatch.trust.keys import load_signing_key
    from faultwatch.trust.records import NODE_RECORD, signer_for
    from faultwatch.wire.topics import Topics

    node = valid_node(args.node)
    bootstrap, topic = _topic(args)
    # an operator's record: signed with $FAULTWATCH_SIGNING_KEY_FILE / --signing-key-file
    key = load_signing_key(getattr(args, "signing_key_file", None))
    # a record every verifying worker would refuse is refused here (exit 8)
    check_operator_write(bootstrap, Topics(args.topic_prefix).status, NODE_RECORD, key,
                         f"nodes {args.nodes_command}")
    rec = change_node(bootstrap, topic, node, make, signer=signer_for(NODE_RECORD, key),
                      must_exist=must_exist)
    log_event(f"node_{args.nodes_command}", node=node, state=rec.state, until=rec.until,
              strikes=rec.strikes, decision=rec.reasons[-1].decision)
    print(orjson.dumps(node_json(rec)).decode())
    return 0


def cmd_quarantine(args: argparse.Namespace) -> int:
    duration = parse_duration_s(args.duration)
    cap = RegistryPolicy().max_quarantine_s
    if duration > cap and not args.force:
        raise ConfigError("--for", f"{args.duration} is longer than the longest automatic "
                                   f"quarantine ({cap / 86400:g} days); pass --force to "
                                   "quarantine this long anyway")
    who = os.environ.get("USER", "")

    def make(rec: NodeRecord | None, node: str, now: float) -> NodeRecord:
        r = Reason(ts=now, event="quarantine", decision=f"manual-{uuid.uuid4().hex[:12]}",
                   rule="manual", line=args.reason, job=who)
        return quarantine(rec, node, now, r, RegistryPolicy(), duration_s=duration)

    return _change(args, make)


def cmd_release(args: argparse.Namespace) -> int:
    who = os.environ.get("USER", "")

    def make(rec: NodeRecord | None, node: str, now: float) -> NodeRecord:
        r = Reason(ts=now, event="release", decision=f"manual-{uuid.uuid4().hex[:12]}",
                   rule="manual", line=args.reason, job=who)
        return release(rec, node, now, r, forget=args.forget)

    return _change(args, make, must_exist=None if args.force else "release")


def _signing_key_flag(p: argparse.ArgumentParser, sub: bool = False) -> None:
    """--signing-key-file; on a subcommand it defaults to SUPPRESS (like options.add_kafka)."""
    options.add_signing_key_file(p, default=argparse.SUPPRESS if sub else None)


def register(sub: Any) -> argparse.ArgumentParser:
    """Add `nodes` (list, quarantine, release) to the top-level CLI's subparsers."""
    p: argparse.ArgumentParser = sub.add_parser(
        "nodes", help="the fleet-wide node registry: list, quarantine, release",
        description="List the node registry (<prefix>nodes), or quarantine/release a node. "
                    "See docs/schedulers.md.")
    options.add_kafka(p)
    _signing_key_flag(p)
    options.add_json(p, "one JSON object per node: node, state, until, strikes, reasons")
    p.set_defaults(func=cmd_nodes, nodes_command="list")
    nsub = options.subcommands(p, "nodes_command", metavar="SUBCOMMAND")
    q = nsub.add_parser("quarantine", help="quarantine NODE for a while (actuators drain it)")
    options.add_kafka(q, sub=True)
    _signing_key_flag(q, sub=True)
    q.add_argument("node")
    q.add_argument("--for", dest="duration", required=True, metavar="DURATION",
                   help="how long: 90s, 30m, 2h, 1d")
    q.add_argument("--reason", required=True, help="why (kept in the node's history)")
    q.add_argument("--force", action="store_true",
                   help="allow a --for longer than the automatic cap (7 days)")
    q.set_defaults(func=cmd_quarantine)
    r = nsub.add_parser("release", help="release NODE now (actuators resume it)")
    options.add_kafka(r, sub=True)
    _signing_key_flag(r, sub=True)
    r.add_argument("node")
    r.add_argument("--reason", default="released by hand", help="why (kept in the history)")
    r.add_argument("--forget", action="store_true",
                   help="also clear its strikes (the next quarantine is short again)")
    r.add_argument("--force", action="store_true",
                   help="write the release even for a node the registry does not hold (a "
                        "node never seen is refused: exit 7, nothing written)")
    r.set_defaults(func=cmd_release)
    return p
