"""What changes between two rule sets in force (`faultwatch rules diff`): rules added,
removed and changed (key by key, patterns as added/removed), exception defaults and policy.
Pure: takes two rules.layers.RulesInForce."""

from __future__ import annotations

from typing import Any

from faultwatch.rules.layers import RulesInForce
from faultwatch.rules.loader import PATTERN_KEYS

_SCALARS = ("kind", "category", "stream", "action", "cascade", "ignore_case", "priority",
            "stage", "opens", "hang_window_s")


def diff(old: RulesInForce, new: RulesInForce) -> dict[str, Any]:
    """{"old", "new": versions, "added": [...], "removed": [...], "changed": [...],
    "exceptions": {...}, "policy": {key: [old, new, new origin]}}; empty lists when equal."""
    o = {r.id: r for r in old.ruleset.rules}
    n = {r.id: r for r in new.ruleset.rules}
    added = [{"id": rid, "category": n[rid].category or n[rid].kind,
              "at": (new.ruleset.origins.get(rid) or ("",))[-1]} for rid in n if rid not in o]
    removed = [{"id": rid, "category": o[rid].category or o[rid].kind,
                "why": (new.why(rid) or ["no layer defines it any more"])[0]}
               for rid in o if rid not in n]
    changed = []
    for rid in n:
        if rid not in o or o[rid].fingerprint() == n[rid].fingerprint():
            continue
        a, b = o[rid], n[rid]
        keys: dict[str, Any] = {k: [getattr(a, k), getattr(b, k)] for k in _SCALARS
                                if getattr(a, k) != getattr(b, k)}
        for k in PATTERN_KEYS:
            plus = [x for x in getattr(b, k) if x not in getattr(a, k)]
            minus = [x for x in getattr(a, k) if x not in getattr(b, k)]
            if plus or minus:
                keys[k] = {"added": plus, "removed": minus}
        changed.append({"id": rid, "changes": keys,
                        "at": (new.ruleset.origins.get(rid) or ("",))[-1]})
    exc = {name: [old.ruleset.exceptions.get(name), new.ruleset.exceptions.get(name)]
           for name in sorted({*old.ruleset.exceptions, *new.ruleset.exceptions})
           if old.ruleset.exceptions.get(name) != new.ruleset.exceptions.get(name)}
    po, pn = old.policy.to_dict(), new.policy.to_dict()
    origins = new.policy_origins()
    policy = {k: [po[k], pn[k], origins.get(k, "default")] for k in pn if po.get(k) != pn[k]}
    return {"old": old.version, "new": new.version, "added": added, "removed": removed,
            "changed": changed, "exceptions": exc, "policy": policy}


def is_empty(d: dict[str, Any]) -> bool:
    return not any(d[k] for k in ("added", "removed", "changed", "exceptions", "policy"))


def render(d: dict[str, Any]) -> list[str]:
    """Lines for people: `+ id`, `- id`, `~ id: key old -> new`, `policy key: old -> new`."""
    out = [f"rules {d['old']} -> {d['new']}: {len(d['added'])} added, {len(d['removed'])} "
           f"removed, {len(d['changed'])} changed; {len(d['policy'])} policy key(s) changed"]
    out += [f"+ {a['id']}  {a['category']}  ({a['at']})" for a in d["added"]]
    out += [f"- {r['id']}  {r['category']}  ({r['why']})" for r in d["removed"]]
    for c in d["changed"]:
        parts = []
        for k, v in c["changes"].items():
            if isinstance(v, dict):
                parts += [f"{k} +{x!r}" for x in v["added"]] + [f"{k} -{x!r}" for x in v["removed"]]
            else:
                parts.append(f"{k} {v[0]} -> {v[1]}")
        out.append(f"~ {c['id']}: {'; '.join(parts)}  ({c['at']})")
    out += [f"~ exception {k}: {v[0]} -> {v[1]}" for k, v in d["exceptions"].items()]
    out += [f"policy {k}: {v[0]} -> {v[1]}  ({v[2]})" for k, v in d["policy"].items()]
    return out
