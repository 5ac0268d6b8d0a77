"""Human-readable rendering of decisions and shipped lines for the CLI."""

from __future__ import annotations

import functools
import math
import time
import zlib
from typing import Any

from faultwatch.core.events import Decision
from faultwatch.eventlog import clean


def _when(ts: float | None) -> str:
    if ts is None:
        return "?"
    return time.strftime("%H:%M:%S", time.localtime(ts)) + f".{int((ts % 1) * 1000):03d}"


_ACTION_STYLE = {"restart": "bold yellow", "fail": "bold red", "blacklist": "bold red",
                 "notify": "bold cyan"}


def age(seconds: float) -> str:
    """A duration as kubectl prints an AGE: 45s, 3m12s, 42m, 5h12m, 20h, 3d4h, 30d."""
    s = max(0, int(seconds))
    if s < 120:
        return f"{s}s"
    m, h, d = s // 60, s // 3600, s // 86400
    if m < 10:
        return f"{m}m{s % 60}s" if s % 60 else f"{m}m"
    if h < 3:
        return f"{m}m"
    if h < 8:
        return f"{h}h{m % 60}m" if m % 60 else f"{h}h"
    if d < 2:
        return f"{h}h"
    if d < 8:
        return f"{d}d{h % 24}h" if h % 24 else f"{d}d"
    return f"{d}d"


def render_decision(d: Decision, color: bool = False, now: float | None = None) -> str:
    """What was decided, why, and the evidence line, for a person to read; with `now` (a
    reader of the topic, not the run that made it) the header also says when, and its age,
    as kubectl's AGE; with `color` (a terminal) the first line is styled by the action
    (rich), the text is the same."""
    text = _decision_text(d)
    if now is not None:
        head, sep, rest = text.partition("\n")
        when = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(d.ts))
        text = f"{head} time={when} age={age(now - d.ts)}" + sep + rest
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
                text, own = str(texts[-1]), f"[rank{rank}]:"  # torchrun's prefix says it
                lines.append(f"  last line of rank {rank}: "
                             f"{text[len(own):] if text.startswith(own) else text}")
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


# ---- `faultwatch logs`: rows as rich Text (colour on a terminal) and as JSON objects ---------

_PALETTE = ("cyan", "green", "magenta", "blue", "yellow", "bright_cyan", "bright_green",
            "bright_magenta", "bright_blue", "bright_yellow")
_ACTION_STYLE = {"restart": "bold yellow", "blacklist": "bold magenta", "fail": "bold red",
                 "notify": "bold blue"}


@functools.lru_cache(maxsize=4096)
def who(node: str | None, rank: int | None) -> tuple[str, str]:
    """A line's prefix (`n1/rank0`, escaped) and its colour: stable per node and rank, the
    same on every run and machine."""
    text = clean(node) if rank is None else f"{clean(node)}/rank{rank}"
    return text, _PALETTE[zlib.crc32(f"{node}/{rank}".encode()) % len(_PALETTE)]


@functools.lru_cache(maxsize=256)
def _second(s: int) -> str:
    return time.strftime("%H:%M:%S", time.localtime(s))


def _clock(ts: float) -> str:
    """HH:MM:SS.mmm in the local time zone."""
    s = math.floor(ts)
    return f"{_second(s)}.{min(999, int((ts - s) * 1000)):03d}"


Segments = list[tuple[str, str]]


def row_segments(row: Any) -> Segments:
    """One `faultwatch logs` row (readers.timeline.Row) as (text, rich style) pieces: the
    time, a coloured node/rank prefix (`!` after it, and the text in red, for stderr),
    separators in bold. Every piece of job text is escaped (eventlog.clean): a line cannot
    move the cursor or forge another line."""
    from faultwatch.readers.timeline import ATTEMPT, DECISION, EXIT, LINE

    segs: Segments = [(_clock(row.ts) + " ", "dim")]
    if row.kind == LINE or row.kind == "bootcheck":
        name, style = who(row.node, row.rank)
        err = row.stream not in (None, "stdout")  # stderr, a boot check
        segs.append((f"[{name}", style))
        if err:
            segs.append((" !", "bold red"))
        segs.append(("] ", style))
        segs.append((clean(row.text, keep_tab=True), "red" if row.stream == "stderr" else ""))
        return segs
    if row.kind == ATTEMPT:
        head = f"── attempt {row.attempt} of {clean(row.job)}"
        head += f" (run {clean(row.run_id)})" if row.run_id else ""
        head += f" starts ({clean(row.node)} first)" if row.node else " starts"
        d = row.decision
        if d is not None:
            head += (f", after {d['action']} decision {clean(d['id'])} ({clean(d['kind'])}"
                     + (f", rule {clean(d['rule'])}" if d.get("rule") else "") + ")")
            if d.get("message"):
                head += f": {clean(d['message'])}"
        segs.append((head + " ──", "bold cyan"))
        return segs
    if row.kind == DECISION:
        d = row.decision or {}
        targets = ",".join(str(n) for n in d.get("nodes") or []) or "-"
        text = (f"── decision {str(d.get('action', '?')).upper()} attempt {row.attempt} "
                f"kind={d.get('kind')}" + (f" rule={d['rule']}" if d.get("rule") else "")
                + f" nodes={targets} id={d.get('id')}"
                + (f": {row.text}" if row.text else ""))
        segs.append((clean(text), _ACTION_STYLE.get(str(d.get("action")), "bold")))
        return segs
    if row.kind == EXIT:
        ok = (row.data or {}).get("exit_code") == 0
        segs.append((f"── {clean(row.node)} attempt {row.attempt}: {clean(row.text)}",
                     "bold green" if ok else "bold red"))
        return segs
    segs.append((clean(row.text), ""))
    return segs


def render_plain(row: Any) -> str:
    """The row as plain text (a pipe, a file)."""
    return "".join(t for t, _ in row_segments(row))


def render_row(row: Any) -> Any:
    """The row as a rich Text (a terminal: with colour)."""
    from rich.text import Text

    return Text.assemble(*row_segments(row))


ROW_FIELDS = ("type", "ts", "job", "run_id", "attempt", "node", "rank", "stream", "seq",
              "text", "flags", "decision", "data")


def row_json(row: Any) -> dict[str, Any]:
    """One `faultwatch logs --json` object: always the fields ROW_FIELDS, null where they do
    not apply (`decision` on decision rows and on the attempt row a restart caused; `data`:
    the checks of a bootcheck row). `text` is the line as shipped, not escaped."""
    return {"type": row.kind, "ts": row.ts, "job": row.job, "run_id": row.run_id,
            "attempt": row.attempt, "node": row.node, "rank": row.rank, "stream": row.stream,
            "seq": row.seq, "text": row.text, "flags": row.flags,
            "decision": dict(row.decision) if row.decision is not None else None,
            "data": dict(row.data) if row.data is not None else None}
