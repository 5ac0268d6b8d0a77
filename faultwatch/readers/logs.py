"""`faultwatch logs JOB`: a job's shipped lines, every node and rank, each line once (and the
nodes' boot-check notes), as text or JSON lines."""

from __future__ import annotations

import sys
from collections.abc import Mapping
from typing import Any, TextIO

import orjson


def print_logs(bootstrap: str, topic: str, job: str, *, follow: bool = False,
               as_json: bool = False, out: TextIO | None = None) -> int:
    """Print `job`'s lines from the logs topic; with `follow`, keep printing new ones."""
    from faultwatch.kafka.reading import read_topic, run_reader
    from faultwatch.readers.render import render_line
    from faultwatch.rules.prefix import strip_rank
    from faultwatch.wire import lines_of

    seen: set[tuple[str, str, str, str, int]] = set()
    seen_notes: set[tuple[str, ...]] = set()

    def emit(item: tuple[Any, dict[str, Any]]) -> None:
        _, d = item
        stream = out or sys.stdout
        if d.get("job") == job and d.get("t") == "note" and d.get("kind") == "bootcheck":
            print_check_note(d, seen_notes, as_json, stream)  # boot/after-failure checks
            return
        if d.get("job") != job or d.get("t") != "lines":
            return
        node, run_id = str(d.get("node")), str(d.get("run_id", ""))
        attempt = str(d.get("attempt"))  # one run id spans attempts: seq restarts with each
        for ln in lines_of(d):
            k = (node, run_id, attempt, ln.stream, ln.seq)
            if k in seen:  # redelivered after an agent restart or a broker outage
                continue
            seen.add(k)
            rank, text = strip_rank(ln.text, d.get("rank"))
            if as_json:
                stream.write(orjson.dumps({
                    "node": node, "attempt": d.get("attempt"), "rank": rank,
                    "stream": ln.stream, "seq": ln.seq, "ts": ln.ts, "text": ln.text,
                    "flags": ln.flags}).decode() + "\n")
            else:
                stream.write(render_line(node, rank, ln.stream, text) + "\n")
        stream.flush()

    return run_reader(read_topic(bootstrap, topic, follow=follow, must_exist=True), emit)


def print_check_note(d: Mapping[str, Any], seen: set[tuple[str, ...]], as_json: bool,
                     out: TextIO) -> None:
    """Print a `bootcheck` note of the logs topic as `faultwatch logs` shows lines (once)."""
    from faultwatch.nodes.checks import checks_of, render_checks
    from faultwatch.readers.render import render_line

    key = tuple(str(d.get(k, "")) for k in ("node", "run_id", "attempt", "ts"))
    if key in seen:
        return
    seen.add(key)
    raw = d.get("data")
    data: Mapping[str, Any] = raw if isinstance(raw, dict) else {}
    text = render_checks(data)
    if as_json:
        out.write(orjson.dumps({
            "node": d.get("node"), "attempt": d.get("attempt"), "rank": None,
            "stream": "bootcheck", "seq": None, "ts": d.get("ts"), "text": text,
            "checks": checks_of(data)}).decode() + "\n")
    else:
        out.write(render_line(str(d.get("node")), None, "bootcheck", text) + "\n")
    out.flush()
