"""Judging nodes' boot-check notes (pure): which checks failed, and which node is the odd one
out of a job (a version or GPU set unlike the others', an all-reduce far slower)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

PASS, FAIL, NOT_APPLICABLE = "pass", "fail", "not_applicable"
COMPARED = ("python", "torch", "cuda", "nccl", "driver", "gpus")
SLOW_FRACTION = 0.5  # a node whose bus bandwidth is below half the job's median is slow
MAX_CHECKS = 64  # checks read from one note


def checks_of(data: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The well-formed checks of a `bootcheck` note's data (name and status strings)."""
    raw = data.get("checks")
    if not isinstance(raw, list):
        return []
    return [c for c in raw[:MAX_CHECKS] if isinstance(c, dict)
            and isinstance(c.get("name"), str) and c.get("status") in (PASS, FAIL,
                                                                        NOT_APPLICABLE)]


def failed_checks(data: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The checks of a note that really checked and failed (`not_applicable` never fails)."""
    return [c for c in checks_of(data) if c["status"] == FAIL]


def blames_node(c: Mapping[str, Any]) -> bool:
    """Whether a failed check is evidence against the node that ran it. Every check is,
    except an all-reduce across the job's nodes (`scope` "job"): every rank of a collective
    sees the same timeout or wrong sum, so its failure names no node (a slow node is found
    by comparing bandwidths instead). An all-reduce among this node's own processes
    (`scope` "node") does blame it."""
    return c.get("name") != "allreduce" or c.get("scope") == "node"


def _comparable(c: Mapping[str, Any]) -> str | None:
    if c.get("name") == "torch" and c.get("status") == NOT_APPLICABLE:
        return "not installed"  # compared: the job's other nodes may have it
    if c.get("status") != PASS:
        return None
    v = c.get("value")
    if c.get("name") == "gpus" and isinstance(v, dict):
        return f"{v.get('count')}x {'/'.join(v.get('types') or []) or 'none'}"
    return None if v is None else str(v)


def compare_nodes(results: Mapping[str, list[dict[str, Any]]],
                  slow_fraction: float = SLOW_FRACTION,
                  reference: str | None = None) -> list[dict[str, Any]]:
    """The odd ones out among a job's nodes' checks: a version (Python, torch, CUDA, NCCL,
    driver) or GPU set that differs from the majority, and an all-reduce bus bandwidth below
    `slow_fraction` of the median. With no majority (two nodes that differ), the value of
    `reference` (the job's rank-0 node) is taken as the expected one; without a reference
    every node is named. Each finding names the node and says its basis."""
    findings: list[dict[str, Any]] = []
    if len(results) < 2:
        return findings
    for name in COMPARED:
        vals = {node: v for node, checks in results.items() for c in checks
                if c.get("name") == name and (v := _comparable(c)) is not None}
        distinct = sorted(set(vals.values()))
        if len(distinct) < 2:
            continue
        counts = {v: list(vals.values()).count(v) for v in distinct}
        top = max(counts.values())
        majority = [v for v in distinct if counts[v] == top]
        if len(majority) == 1:
            common, basis = majority[0], "majority"
        elif reference is not None and reference in vals:
            common, basis = vals[reference], f"no majority: {reference} (rank 0) is the reference"
        else:
            common, basis = None, "no majority"
        for node in sorted(vals):
            if vals[node] != common:
                findings.append({"check": name, "node": node, "value": vals[node],
                                 "expected": common, "basis": basis,
                                 "values": dict(sorted(vals.items()))})
    bw = {node: float(c["value"]["busbw_gb_s"]) for node, checks in results.items()
          for c in checks if c.get("name") == "allreduce" and c.get("status") == PASS
          and isinstance(c.get("value"), dict)
          and isinstance(c["value"].get("busbw_gb_s"), int | float)}
    if len(bw) >= 2:
        ordered = sorted(bw.values())
        mid = len(ordered) // 2
        median = ordered[mid] if len(ordered) % 2 else (ordered[mid - 1] + ordered[mid]) / 2
        for node in sorted(bw):
            if bw[node] < slow_fraction * median:
                findings.append({"check": "allreduce", "node": node, "busbw_gb_s": bw[node],
                                 "median_gb_s": median, "slow_fraction": slow_fraction,
                                 "basis": "bandwidth", "values": dict(sorted(bw.items()))})
    return findings


def render_checks(data: Mapping[str, Any]) -> str:
    """One line for `faultwatch logs`: when the checks ran, the verdict, each check (a failed
    one with its detail)."""
    parts = []
    for c in checks_of(data):
        v = c.get("value")
        if c["status"] == FAIL:
            parts.append(f"{c['name']} FAILED ({str(c.get('detail') or '')[:200]})")
        elif c["status"] == NOT_APPLICABLE:
            parts.append(f"{c['name']} n/a")
        else:
            parts.append(f"{c['name']} ok" + (f" {v}" if isinstance(v, str | int | float)
                                              else ""))
    when = data.get("when") if isinstance(data.get("when"), str) else "on demand" \
        if data.get("on_demand") else "start"
    verdict = "ok" if not any(c["status"] == FAIL for c in checks_of(data)) else "FAILED"
    return f"bootcheck ({when}): {verdict}: " + ", ".join(parts)
