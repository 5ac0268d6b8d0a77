"""The compacted tables: the status topic (the latest snapshot per job, for `faultwatch
status`) and the nodes topic (the fleet-wide node registry, key = node)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import orjson

from faultwatch.core.registry import MAX_REASONS, NodeRecord
from faultwatch.core.registry import STATES as NODE_STATES
from faultwatch.core.registry import Reason as NodeReason
from faultwatch.wire._check import (
    MAX_ATTEMPT,
    SCHEMA_VERSION,
    _bad,
    _bool,
    _get,
    _int,
    _list,
    _load_object,
    _num,
    _obj,
    _opt_num,
    _text,
    decode,
    safe_name,
)

# A processor worker's record on the status topic: which rules it runs (for `rules show` and
# `status`; rollout/rules_status.py publishes and reads it). Its key starts with a control
# character, which no job name may hold, so it never collides with a job's snapshot.
WORKER_KEY_PREFIX = b"\x00worker/"


def worker_key(worker: str) -> bytes:
    return WORKER_KEY_PREFIX + worker.encode()


def encode_worker(worker: str, group: str, rules: Mapping[str, Any], now: float,
                  started_at: float, rejected: Mapping[str, Any] | None = None,
                  trust: Mapping[str, Any] | None = None,
                  refused: Mapping[str, Any] | None = None) -> bytes:
    """{"v", "t": "worker", "worker", "group", "ts", "started_at", "rules" (a
    rules.layers.RulesInForce.describe()), "rejected"?: {"count", "last"}, "trust"?: the
    policy it announces (trust/announce.py), "refused"?: {"counts", "last"} (records its
    trust file refused: trust/refusals.py)}."""
    d: dict[str, Any] = {"v": SCHEMA_VERSION, "t": "worker", "worker": worker, "group": group,
                         "ts": now, "started_at": started_at, "rules": dict(rules)}
    if rejected:
        d["rejected"] = dict(rejected)
    if trust is not None:
        d["trust"] = dict(trust)
    if refused:
        d["refused"] = dict(refused)
    return orjson.dumps(d, default=str)


def decode_worker(value: bytes | None) -> dict[str, Any]:
    """A worker record, checked enough to show (DecodeError otherwise)."""
    d = decode(value)
    if d["t"] != "worker":
        raise _bad("worker.t", "must be 'worker'", d["t"])
    safe_name(_get(d, "worker", "worker"), "worker.worker")
    _num(_get(d, "ts", "worker"), "worker.ts")
    _obj(_get(d, "rules", "worker"), "worker.rules")
    return d


def encode_status(snapshot: Mapping[str, Any]) -> bytes:
    """A job's status snapshot (faultwatch.core.status.snapshot) as a status-topic record."""
    return orjson.dumps({**snapshot, "v": SCHEMA_VERSION, "t": "status"})


def decode_status(value: bytes | None) -> dict[str, Any]:
    """One status-topic record: versioned, typed, with a safe job name and a finite time."""
    d = decode(value)
    if d["t"] != "status":
        raise _bad("status.t", "must be 'status'", d["t"])
    safe_name(_get(d, "job", "status"), "status.job")
    _int(_get(d, "attempt", "status"), "status.attempt", 0, MAX_ATTEMPT)
    _num(_get(d, "ts", "status"), "status.ts")
    return d


# ---- nodes topic (the fleet-wide node registry, compacted, key = node) --------------------

def encode_node(rec: NodeRecord) -> bytes:
    return orjson.dumps({"v": SCHEMA_VERSION, "t": "node", **rec.to_dict()})


def decode_node(value: bytes | None) -> NodeRecord:
    """One nodes-topic record, validated. Raises DecodeError saying what is wrong."""
    d = _load_object(value)
    if d.get("v") != SCHEMA_VERSION or d.get("t") != "node":
        raise _bad("node", f"must be a v{SCHEMA_VERSION} 'node' record",
                   f"v={d.get('v')!r} t={d.get('t')!r}")
    state = _get(d, "state", "node")
    if state not in NODE_STATES:
        raise _bad("node.state", f"must be one of {NODE_STATES}", state)
    reasons = []
    for r in _list(d.get("reasons", []), "node.reasons")[-MAX_REASONS:]:
        r = _obj(r, "node.reasons[]")
        rule, line = r.get("rule"), r.get("line")
        reasons.append(NodeReason(
            ts=_num(_get(r, "ts", "node.reasons[]"), "node.reasons[].ts"),
            event=safe_name(_get(r, "event", "node.reasons[]"), "node.reasons[].event"),
            decision=safe_name(r.get("decision", ""), "node.reasons[].decision", empty_ok=True),
            rule=None if rule is None else safe_name(rule, "node.reasons[].rule"),
            line=None if line is None else _text(line, "node.reasons[].line"),
            job=safe_name(r.get("job", ""), "node.reasons[].job", empty_ok=True)))
    return NodeRecord(node=safe_name(_get(d, "node", "node"), "node.node"), state=state,
                      until=_opt_num(d.get("until"), "node.until"),
                      strikes=_int(_get(d, "strikes", "node"), "node.strikes", 0, 1_000_000),
                      reasons=tuple(reasons), updated_ts=_num(d.get("updated_ts", 0.0),
                                                              "node.updated_ts"),
                      probation=_bool(d.get("probation", False), "node.probation"),
                      seq=_int(d.get("seq", 0), "node.seq", 0, 2**53))
