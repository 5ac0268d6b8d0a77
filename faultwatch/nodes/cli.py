"""`faultwatch nodes`: list the fleet-wide node registry, quarantine and release nodes."""

from __future__ import annotations

import argparse
import asyncio
import os
import re
import time
import uuid
from pathlib import Path
from typing import Any

import orjson

from faultwatch.core.registry import (
    NodeRecord,
    Reason,
    Registry,
    RegistryPolicy,
    expire,
    quarantine,
    release,
)
from faultwatch.errors import ConfigError, FaultwatchError
from faultwatch.nodes.names import valid_node

_UNITS = {"s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}
_DURATION_RE = re.compile(r"(?:(\d+(?:\.\d+)?)([smhd]))+|\d+(?:\.\d+)?")


def parse_duration_s(text: str) -> float:
    """'90', '90s', '30m', '2h', '1d', '1h30m' -> seconds (> 0)."""
    t = text.strip().lower()
    if not t or _DURATION_RE.fullmatch(t) is None:
        raise ConfigError("--for", f"not a duration: {text!r} (e.g. 90s, 30m, 2h, 1d)")
    if t[-1].isdigit():
        total = float(t)
    else:
        total = sum(float(n) * _UNITS[u] for n, u in re.findall(r"(\d+(?:\.\d+)?)([smhd])", t))
    if total <= 0:
        raise ConfigError("--for", f"duration must be positive: {text!r}")
    return total


def _topic(args: argparse.Namespace) -> tuple[str, str]:
    from faultwatch.wire.topics import Topics

    if not args.bootstrap:
        raise FaultwatchError("no Kafka bootstrap: pass --bootstrap HOST:PORT or set "
                              "FAULTWATCH_BOOTSTRAP")
    return str(args.bootstrap), Topics(args.topic_prefix).nodes


def _iso(ts: float | None) -> str:
    if ts is None:
        return "-"
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(ts))


def node_json(rec: NodeRecord) -> dict[str, Any]:
    """The `faultwatch nodes --json` object: node, state, until, strikes, reasons."""
    return {"node": rec.node, "state": rec.state, "until": rec.until, "strikes": rec.strikes,
            "probation": rec.probation, "reasons": [r.to_dict() for r in rec.reasons]}


def render(reg: Registry, now: float, as_json: bool) -> list[str]:
    out = []
    for node in sorted(reg):
        rec = expire(reg[node], now, RegistryPolicy())
        if as_json:
            out.append(orjson.dumps(node_json(rec)).decode())
            continue
        last = rec.reasons[-1] if rec.reasons else None
        why = ""
        if last is not None:
            why = f"{last.event} {last.decision or ''} {last.rule or ''}".strip()
            if last.line:
                why += f": {last.line[:120]}"
        state = rec.state + (" (probation)" if rec.probation else "")
        out.append(f"{rec.node:<24} {state:<22} until={_iso(rec.until):<21} "
                   f"strikes={rec.strikes:<3} {why}")
    return out


def cmd_nodes(args: argparse.Namespace) -> int:
    from faultwatch.kafka.errors import BROKER_ERRORS, broker_error
    from faultwatch.nodes.store import load_registry

    bootstrap, topic = _topic(args)
    try:
        reg = asyncio.run(load_registry(bootstrap, topic))
    except BROKER_ERRORS as e:
        raise broker_error(e, bootstrap, f"reading the node registry {topic}") from None
    for line in render(reg, time.time(), args.json):
        print(line)
    return 0


def _change(args: argparse.Namespace, make: Any) -> int:
    from faultwatch.kafka.admin import ensure_compacted_topic
    from faultwatch.logs import log_event
    from faultwatch.nodes.store import load_registry, write_records
    from faultwatch.trust.keys import load_signing_key
    from faultwatch.trust.records import NODE_RECORD, signer_for

    node = valid_node(args.node)
    bootstrap, topic = _topic(args)
    # an operator's record: signed with $FAULTWATCH_SIGNING_KEY_FILE / --signing-key-file
    signer = signer_for(NODE_RECORD, load_signing_key(getattr(args, "signing_key_file", None)))

    async def main() -> NodeRecord:
        await ensure_compacted_topic(bootstrap, topic)
        reg = await load_registry(bootstrap, topic)
        rec = make(reg.get(node), node, time.time())
        await write_records(bootstrap, topic, [rec], signer=signer)
        return rec

    from faultwatch.kafka.errors import BROKER_ERRORS, broker_error

    try:
        rec = asyncio.run(main())
    except BROKER_ERRORS as e:
        raise broker_error(e, bootstrap, f"changing node {node} in {topic}") from None
    log_event(f"node_{args.nodes_command}", node=node, state=rec.state, until=rec.until,
              strikes=rec.strikes, decision=rec.reasons[-1].decision)
    print(orjson.dumps(node_json(rec)).decode())
    return 0


def cmd_quarantine(args: argparse.Namespace) -> int:
    duration = parse_duration_s(args.duration)
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

    return _change(args, make)


def _kafka_flags(p: argparse.ArgumentParser, sub: bool = False) -> None:
    """Kafka flags; on a subcommand they default to SUPPRESS so `nodes --bootstrap X
    release N` keeps the X given before the subcommand."""
    from faultwatch.wire.topics import DEFAULT_PREFIX

    p.add_argument("--bootstrap",
                   default=argparse.SUPPRESS if sub else os.environ.get("FAULTWATCH_BOOTSTRAP"),
                   help="Kafka bootstrap HOST:PORT (default $FAULTWATCH_BOOTSTRAP)")
    p.add_argument("--topic-prefix",
                   default=argparse.SUPPRESS if sub else
                   os.environ.get("FAULTWATCH_TOPIC_PREFIX", DEFAULT_PREFIX),
                   help="topic name prefix (default $FAULTWATCH_TOPIC_PREFIX or 'faultwatch.')")
    p.add_argument("--signing-key-file", type=Path,
                   default=argparse.SUPPRESS if sub else None,
                   help="operator's Ed25519 key that signs the record (default "
                        "$FAULTWATCH_SIGNING_KEY_FILE; see `faultwatch keys`)")


def register(sub: Any) -> argparse.ArgumentParser:
    """Add `nodes` (list, quarantine, release) to the top-level CLI's subparsers."""
    p: argparse.ArgumentParser = sub.add_parser(
        "nodes", help="the fleet-wide node registry: list, quarantine, release",
        description="List the node registry (<prefix>nodes), or quarantine/release a node. "
                    "See docs/schedulers.md.")
    _kafka_flags(p)
    p.add_argument("--json", action="store_true",
                   help="one JSON object per node: node, state, until, strikes, reasons")
    p.set_defaults(func=cmd_nodes, nodes_command="list")
    nsub = p.add_subparsers(dest="nodes_command", metavar="SUBCOMMAND")
    q = nsub.add_parser("quarantine", help="quarantine NODE for a while (actuators drain it)")
    _kafka_flags(q, sub=True)
    q.add_argument("node")
    q.add_argument("--for", dest="duration", required=True, metavar="DURATION",
                   help="how long: 90s, 30m, 2h, 1d")
    q.add_argument("--reason", required=True, help="why (kept in the node's history)")
    q.set_defaults(func=cmd_quarantine)
    r = nsub.add_parser("release", help="release NODE now (actuators resume it)")
    _kafka_flags(r, sub=True)
    r.add_argument("node")
    r.add_argument("--reason", default="released by hand", help="why (kept in the history)")
    r.add_argument("--forget", action="store_true",
                   help="also clear its strikes (the next quarantine is short again)")
    r.set_defaults(func=cmd_release)
    return p
