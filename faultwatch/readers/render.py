"""Human-readable rendering of decisions and shipped lines for the CLI."""

from __future__ import annotations

import time
from typing import Any

from faultwatch.core.events import Decision
from faultwatch.eventlog import clean


def _when(ts: float | None) -> str:
    if ts is None:
        return "?"
    return time.strftime("%H:%M:%S", time.localtime(ts)) + f".{int((ts % 1) * 1000):03d}"


_ACTION_STYLE = {"restart": "bold yellow", "fail": "bold red", "blacklist": "bold red",
                 "notify": "bold cyan"}


def render_decision(d: Decision, color: bool = False) -> str:
    """What was decided, why, and the evidence line, for a person to read; with `color` (a
    terminal) the first line is styled by the action (rich), the text is the same."""
    text = _decision_text(d)
    if not color:
        return text
    head, sep, rest = text.partition("\n")
    return _styled(head, _ACTION_STYLE.get(d.action, "bold")) + sep + rest


def _styled(text: str, style: str) -> str:
    """text with rich's ANSI codes for style (no markup read from text: it is job text)."""
    import io

    from rich.console import Console
    from rich.text import Text

    console = Console(file=io.StringIO(), force_terminal=True, color_system="standard",
                      width=max(80, len(text) + 1), highlight=False, soft_wrap=True)
    with console.capture() as cap:
        console.print(Text(text, style=style), end="")
    return cap.get()


def _decision_text(d: Decision) -> str:
    targets = ",".join(str(n) for n in d.nodes) or "-"
    ranks = ",".join(str(r) for r in d.ranks)
    head = (f"[faultwatch] decision {d.action.upper()} job={d.job} attempt={d.attempt} "
            f"kind={d.kind} nodes={targets}" + (f" ranks={ranks}" if ranks else "")
            + f" id={d.id}")
    lines = [head, f"  why: {d.message}"]
    ev: dict[str, Any] = d.evidence if isinstance(d.evidence, dict) else {}
    first = ev.get("first_error")
    if isinstance(first, dict) and first.get("line"):
        where = f"{first.get('node')}" + (f" rank {first['rank']}" if first.get("rank") is not None
                                          else "")
        ts = first.get("ts")
        lines.append(f"  evidence ({where} at {_when(ts if isinstance(ts, float | int) else None)})"
                     f": {first['line']}")
    last = ev.get("last_lines")
    if isinstance(last, dict):
        for rank, texts in sorted(last.items(), key=lambda kv: str(kv[0])):
            if isinstance(texts, list) and texts:
                lines.append(f"  last line of rank {rank}: {texts[-1]}")
    budgets = d.budgets
    if isinstance(budgets, dict) and budgets:
        lines.append(f"  restarts used: {budgets.get('restarts_used')}/"
                     f"{budgets.get('max_restarts')}  rules: {d.rules_version or '-'}")
    return "\n".join(clean(ln) for ln in lines)  # one terminal line per entry, no more


def render_line(node: str, rank: int | None, stream: str, text: str) -> str:
    """One shipped line with its node/rank prefix, as `faultwatch logs` prints it."""
    who = clean(node) if rank is None else f"{clean(node)}/rank{rank}"
    marker = "" if stream == "stdout" else " !"
    return f"[{who}{marker}] {clean(text, keep_tab=True)}"
