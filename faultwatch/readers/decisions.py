"""`faultwatch decisions`: the decisions topic, each decision id once, filtered
(readers/select.py: job, action, kind, time), as text or JSON lines."""

from __future__ import annotations

import sys
from typing import Any, TextIO

import orjson

from faultwatch.core.events import Decision
from faultwatch.readers.select import DecisionFilter


def print_decisions(bootstrap: str, topic: str, *, filt: DecisionFilter | None = None,
                    follow: bool = False, as_json: bool = False,
                    out: TextIO | None = None) -> int:
    """Print the topic's decisions that `filt` keeps from the beginning (from `filt.since`);
    with `follow`, keep printing new ones. A missing topic is a NotFoundError unless
    following."""
    from faultwatch.core.diagnosis import is_probe
    from faultwatch.kafka.reading import read_topic, run_reader
    from faultwatch.readers.render import render_decision
    from faultwatch.wire import decision_to_dict, decode_decision, job_key

    keep = filt or DecisionFilter()
    seen: set[str] = set()

    def emit(item: tuple[Any, Decision]) -> None:
        _, dec = item
        if dec.id in seen:  # decisions are idempotent: show each id once
            return
        if is_probe(dec):  # an older processor's probe (control traffic, not a decision)
            return
        seen.add(dec.id)
        if not keep.keeps(dec):
            return
        stream = out or sys.stdout
        if as_json:
            stream.write(orjson.dumps(decision_to_dict(dec)).decode() + "\n")
        else:
            stream.write(render_decision(dec) + "\n")
        stream.flush()

    key = job_key(keep.job) if keep.job else None
    return run_reader(read_topic(bootstrap, topic, follow=follow, key=key,
                                 decoder=decode_decision, must_exist=True), emit)
