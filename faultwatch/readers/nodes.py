"""`faultwatch nodes`: the node registry as a table or JSON lines."""

from __future__ import annotations

import asyncio
import sys
import time
from typing import Any

import orjson

from faultwatch.core.registry import NodeRecord, Registry, RegistryPolicy, expire


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


def print_nodes(bootstrap: str, topic: str, *, as_json: bool = False) -> int:
    """Print the registry as its topic holds it now; a missing topic is a NotFoundError."""
    from faultwatch.kafka.errors import BROKER_ERRORS, broker_error
    from faultwatch.nodes.store import load_registry

    try:
        reg = asyncio.run(load_registry(bootstrap, topic, must_exist=True))
    except BROKER_ERRORS as e:
        raise broker_error(e, bootstrap, f"reading the node registry {topic}") from None
    for line in render(reg, time.time(), as_json):
        print(line, file=sys.stdout)
    return 0
