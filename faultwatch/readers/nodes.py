"""`faultwatch nodes`: the node registry as a table or JSON lines."""

from __future__ import annotations

import asyncio
import sys
import time
from collections.abc import Mapping
from typing import Any

import orjson

from faultwatch import settings
from faultwatch.core.registry import NodeRecord, Registry, RegistryPolicy, expire
from faultwatch.registry.store import Refused


def _iso(ts: float | None) -> str:
    if ts is None:
        return "-"
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(ts))


def node_json(rec: NodeRecord) -> dict[str, Any]:
    """The `faultwatch nodes --json` object: node, state, until, strikes, reasons."""
    return {"node": rec.node, "state": rec.state, "until": rec.until, "strikes": rec.strikes,
            "probation": rec.probation, "reasons": [r.to_dict() for r in rec.reasons]}


def render(reg: Registry, now: float, as_json: bool,
           refused: Mapping[str, Refused] | None = None) -> list[str]:
    """One line (or JSON object) per node. `refused`: records a trust file refused, per key;
    a node with only such records shows no state (`-`, JSON `state: null`): they are not
    the registry its consumers act on."""
    refused = refused or {}
    out = []
    for node in sorted(reg.keys() | refused.keys()):
        held = reg.get(node)
        bad = refused.get(node)
        note = "" if bad is None else (
            f"refused {bad.count} record(s) "
            f"({', '.join(f'{r} {n}' for r, n in sorted(bad.reasons.items()))}; last at "
            f"{bad.last_at}): not the registry state")
        if held is None:
            if as_json:
                out.append(orjson.dumps({"node": node, "state": None,
                                         "refused": _refused_json(bad)}).decode())
            else:
                out.append(f"{node:<24} {'-':<22} {'':<27} {'':<11} {note}")
            continue
        rec = expire(held, now, RegistryPolicy())
        if as_json:
            d = node_json(rec)
            if bad is not None:
                d["refused"] = _refused_json(bad)
            out.append(orjson.dumps(d).decode())
            continue
        last = rec.reasons[-1] if rec.reasons else None
        why = ""
        if last is not None:
            why = f"{last.event} {last.decision or ''} {last.rule or ''}".strip()
            if last.line:
                why += f": {last.line[:120]}"
        if note:
            why = f"{why}  [{note}]" if why else f"[{note}]"
        state = rec.state + (" (probation)" if rec.probation else "")
        out.append(f"{rec.node:<24} {state:<22} until={_iso(rec.until):<21} "
                   f"strikes={rec.strikes:<3} {why}")
    return out


def _refused_json(bad: Refused | None) -> dict[str, Any] | None:
    if bad is None:
        return None
    return {"count": bad.count, "reasons": dict(bad.reasons), "last_at": bad.last_at}


def print_nodes(bootstrap: str, topic: str, *, as_json: bool = False) -> int:
    """Print the registry as its topic holds it now; a missing topic is a NotFoundError.
    With a trust file ($FAULTWATCH_TRUST_FILE) it is the registry as processors and actuate
    take it: unsigned, forged and replayed records are shown as refused, not as the state."""
    from faultwatch.kafka.errors import BROKER_ERRORS, broker_error
    from faultwatch.registry.store import load_registry, load_verified
    from faultwatch.trust.keys import load_trust
    from faultwatch.trust.records import NODE_RECORD, verifier_for

    verifier = verifier_for(NODE_RECORD, load_trust())
    refused: dict[str, Refused] = {}
    try:
        if verifier is None:
            reg = asyncio.run(load_registry(bootstrap, topic, must_exist=True))
        else:
            reg, refused = asyncio.run(load_verified(bootstrap, topic, verifier,
                                                     must_exist=True))
    except BROKER_ERRORS as e:
        raise broker_error(e, bootstrap, f"reading the node registry {topic}") from None
    for line in render(reg, time.time(), as_json, refused):
        print(line, file=sys.stdout)
    if verifier is None:
        print(f"(unverified: without {settings.TRUST_FILE} every record is shown, signed or "
              "not)", file=sys.stderr)
    return 0
