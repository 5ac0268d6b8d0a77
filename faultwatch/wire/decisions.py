"""The decisions topic (job stage -> agents, schedulers, people): a decision's published
JSON shape (faultwatch/schemas/decision.schema.json) and its one validated decoder."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

import orjson

from faultwatch.core.events import ACTIONS, Decision
from faultwatch.wire._check import (
    MAX_ATTEMPT,
    MAX_ID_CHARS,
    MAX_RANK,
    MAX_RECORD_BYTES,
    SCHEMA_VERSION,
    _bad,
    _get,
    _int,
    _json_obj,
    _list,
    _load_object,
    _num,
    _obj,
    _scheduler,
    _text,
    safe_name,
)


def decision_to_dict(dec: Decision) -> dict[str, Any]:
    """The published JSON shape of a decision (see faultwatch/schemas/decision.schema.json)."""
    return {
        "v": SCHEMA_VERSION,
        "id": dec.id,
        "job": dec.job,
        "attempt": dec.attempt,
        "run_id": dec.run_id,
        "scheduler": dec.scheduler,
        "action": dec.action,
        "targets": {"nodes": list(dec.nodes), "ranks": list(dec.ranks)},
        "reason": {"kind": dec.kind, "rule": dec.rule, "category": dec.category,
                   "message": dec.message},
        "evidence": dec.evidence,
        "budgets": dec.budgets,
        "rules_version": dec.rules_version,
        "ts": dec.ts,
        **({"run_ids": list(dec.run_ids)} if dec.run_ids else {}),
        **({"swaps": [{"node": a, "spare": b} for a, b in dec.swaps]} if dec.swaps else {}),
    }


def encode_decision(dec: Decision) -> bytes:
    return orjson.dumps(decision_to_dict(dec))


def _opt_name(x: Any, field: str) -> str | None:
    return None if x is None else safe_name(x, field)


def decision_of(d: Mapping[str, Any]) -> Decision:
    """The Decision of a decoded decisions-topic dict, every field checked."""
    if d.get("v") != SCHEMA_VERSION:
        raise _bad("decision.v", f"must be {SCHEMA_VERSION}", d.get("v"))
    action = _get(d, "action", "decision")
    if action not in ACTIONS:
        raise _bad("decision.action", f"must be one of {ACTIONS}", action)
    targets = _obj(_get(d, "targets", "decision"), "decision.targets")
    reason = _obj(_get(d, "reason", "decision"), "decision.reason")
    return Decision(
        id=safe_name(_get(d, "id", "decision"), "decision.id"),
        job=safe_name(_get(d, "job", "decision"), "decision.job"),
        attempt=_int(_get(d, "attempt", "decision"), "decision.attempt", 0, MAX_ATTEMPT),
        action=action,
        kind=safe_name(_get(reason, "kind", "decision.reason"), "decision.reason.kind"),
        ts=_num(_get(d, "ts", "decision"), "decision.ts"),
        nodes=tuple(safe_name(n, "decision.targets.nodes")
                    for n in _list(_get(targets, "nodes", "decision.targets"),
                                   "decision.targets.nodes")),
        ranks=tuple(_int(r, "decision.targets.ranks", 0, MAX_RANK)
                    for r in _list(_get(targets, "ranks", "decision.targets"),
                                   "decision.targets.ranks")),
        rule=_opt_name(reason.get("rule"), "decision.reason.rule"),
        category=_opt_name(reason.get("category"), "decision.reason.category"),
        message=_text(reason.get("message", ""), "decision.reason.message"),
        evidence=_json_obj(d.get("evidence", {}), "decision.evidence"),
        budgets=_json_obj(d.get("budgets", {}), "decision.budgets"),
        rules_version=_text(d.get("rules_version", ""), "decision.rules_version", MAX_ID_CHARS),
        run_id=safe_name(d.get("run_id", ""), "decision.run_id", empty_ok=True),
        scheduler=_scheduler(d.get("scheduler") or {}, "decision"),
        run_ids=tuple(safe_name(r, "decision.run_ids")
                      for r in _list(d.get("run_ids") or [], "decision.run_ids")),
        swaps=_swaps(d.get("swaps") or [], action))


MAX_SWAPS = 1024


def _swaps(x: Any, action: str) -> tuple[tuple[str, str], ...]:
    """`swaps`: [{node, spare}], only on a restart or blacklist; no node or spare twice and
    never a node replaced by itself (a consumer acting on it would stop and start one node)."""
    items = _list(x, "decision.swaps", MAX_SWAPS)
    if items and action not in ("restart", "blacklist"):
        raise _bad("decision.swaps", "only a restart or blacklist swaps spares in", action)
    out: list[tuple[str, str]] = []
    for item in items:
        o = _obj(item, "decision.swaps[]")
        pair = (safe_name(_get(o, "node", "decision.swaps[]"), "decision.swaps[].node"),
                safe_name(_get(o, "spare", "decision.swaps[]"), "decision.swaps[].spare"))
        out.append(pair)
    names = [n for pair in out for n in pair]
    if len(set(names)) != len(names):
        raise _bad("decision.swaps", "a node or spare appears twice", names)
    return tuple(out)


def decode_decision(value: bytes | None) -> Decision:
    """One decisions-topic record, validated. Raises DecodeError saying what is wrong."""
    return decision_of(_load_object(value))


MAX_EVIDENCE_STR = 4096  # evidence strings of a too-big decision are cut to this
MAX_EVIDENCE_ITEMS = 64  # ... and its lists to this many items


def _cut(x: Any, depth: int = 0) -> Any:
    if isinstance(x, str):
        return x if len(x) <= MAX_EVIDENCE_STR else x[:MAX_EVIDENCE_STR] + "...[cut]"
    if depth > 8:
        return None
    if isinstance(x, dict):
        return {str(k)[:256]: _cut(v, depth + 1) for k, v in list(x.items())[:MAX_EVIDENCE_ITEMS]}
    if isinstance(x, list | tuple):
        return [_cut(v, depth + 1) for v in list(x)[:MAX_EVIDENCE_ITEMS]]
    return x


def bounded_decision(dec: Decision, max_bytes: int = MAX_RECORD_BYTES) -> Decision:
    """The decision, with its evidence cut (and `evidence.truncated` set) if its record would
    pass `max_bytes`; the id, action, targets and reason never change."""
    if len(encode_decision(dec)) <= max_bytes:
        return dec
    ev = _cut(dict(dec.evidence))
    ev["truncated"] = True
    small = dataclasses.replace(dec, evidence=ev)
    if len(encode_decision(small)) > max_bytes:  # still too big: keep only what acts
        small = dataclasses.replace(dec, evidence={"truncated": True},
                                    message=dec.message[:MAX_EVIDENCE_STR])
    return small
