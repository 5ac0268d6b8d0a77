"""How `faultwatch logs` shows the nodes' boot-check notes (the judging is nodes/checks.py,
pure; this prints)."""

from __future__ import annotations

import sys
from collections.abc import Mapping
from typing import Any

import orjson

from faultwatch.nodes.checks import checks_of, render_checks
from faultwatch.render import render_line


def emit_check_note(d: Mapping[str, Any], seen: set[tuple[str, ...]], as_json: bool) -> None:
    """Print a `bootcheck` note of the logs topic as `faultwatch logs` shows lines (once)."""
    key = tuple(str(d.get(k, "")) for k in ("node", "run_id", "attempt", "ts"))
    if key in seen:
        return
    seen.add(key)
    raw = d.get("data")
    data: Mapping[str, Any] = raw if isinstance(raw, dict) else {}
    text = render_checks(data)
    if as_json:
        sys.stdout.write(orjson.dumps({
            "node": d.get("node"), "attempt": d.get("attempt"), "rank": None,
            "stream": "bootcheck", "seq": None, "ts": d.get("ts"), "text": text,
            "checks": checks_of(data)}).decode() + "\n")
    else:
        sys.stdout.write(render_line(str(d.get("node")), None, "bootcheck", text) + "\n")
    sys.stdout.flush()
