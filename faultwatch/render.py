"""Human-readable rendering of decisions and shipped lines for the CLI."""

from __future__ import annotations

import time
from typing import Any

from faultwatch.core.events import Decision


def _when(ts: float | None) -> str:
    if ts is None:
        return "?"
    return time.strftime("%H:%M:%S", time.localtime(ts)) + f".{int((ts % 1) * 1000):03d}"


def render_decision(d: Decision) -> str:
    """What was decided, why, and the evidence line, for a person to read."""
    targets = ",".join(d.nodes) or "-"
    ranks = ",".join(str(r) for r in d.ranks)
    head = (f"[faultwatch] decision {d.action.upper()} job={d.job} attempt={d.attempt} "
            f"kind={d.kind} nodes={targets}" + (f" ranks={ranks}" if ranks else "")
            + f" id={d.id}")
    lines = [head, f"  why: {d.message}"]
    ev: dict[str, Any] = d.evidence
    first = ev.get("first_error")
    if isinstance(first, dict) and first.get("line"):
        where = f"{first.get('node')}" + (f" rank {first['rank']}" if first.get("rank") is not None
                                          else "")
        lines.append(f"  evidence ({where} at {_when(first.get('ts'))}): {first['line']}")
    last = ev.get("last_lines")
    if isinstance(last, dict):
        for rank, texts in sorted(last.items()):
            if texts:
                lines.append(f"  last line of rank {rank}: {texts[-1]}")
    budgets = d.budgets
    if budgets:
        lines.append(f"  restarts used: {budgets.get('restarts_used')}/"
                     f"{budgets.get('max_restarts')}  rules: {d.rules_version or '-'}")
    return "\n".join(lines)


def render_line(node: str, rank: int | None, stream: str, text: str) -> str:
    """One shipped line with its node/rank prefix, as `faultwatch logs` prints it."""
    who = node if rank is None else f"{node}/rank{rank}"
    marker = "" if stream == "stdout" else " !"
    return f"[{who}{marker}] {text}"
