"""`faultwatch decisions`: the decisions topic, each decision id once, filtered
(readers/select.py: job, action, kind, time), as text or JSON lines."""

from __future__ import annotations

import sys
import time
from typing import Any, TextIO

import orjson

from faultwatch.core.events import Decision
from faultwatch.readers.select import DecisionFilter


def print_decisions(bootstrap: str, topic: str, *, filt: DecisionFilter | None = None,
                    follow: bool = False, as_json: bool = False,
                    out: TextIO | None = None, status_topic: str | None = None) -> int:
    """Print the topic's decisions that `filt` keeps from the beginning (from `filt.since`);
    with `follow`, keep printing new ones. A missing topic is a NotFoundError unless
    following; so is a job (`filt.job`) that neither has a decision nor is known to the
    processors (`status_topic`), like `logs JOB` and `status JOB`: a typo is not an empty
    answer."""
    from faultwatch.core.diagnosis import is_probe
    from faultwatch.kafka.reading import read_topic, run_reader
    from faultwatch.readers.render import render_decision
    from faultwatch.wire import decision_to_dict, decode_decision, job_key

    keep = filt or DecisionFilter()
    seen: set[str] = set()
    known = [False]  # a decision of keep.job was read (whatever the other filters say)

    def emit(item: tuple[Any, Decision]) -> None:
        _, dec = item
        if dec.id in seen:  # decisions are idempotent: show each id once
            return
        if is_probe(dec):  # an older processor's probe (control traffic, not a decision)
            return
        seen.add(dec.id)
        known[0] = known[0] or dec.job == keep.job
        if not keep.keeps(dec):
            return
        stream = out or sys.stdout
        if as_json:
            stream.write(orjson.dumps(decision_to_dict(dec)).decode() + "\n")
        else:
            stream.write(render_decision(dec, now=time.time()) + "\n")
        stream.flush()

    key = job_key(keep.job) if keep.job else None
    code = run_reader(read_topic(bootstrap, topic, follow=follow, key=key,
                                 decoder=decode_decision, must_exist=True), emit)
    if keep.job and not known[0] and not follow and status_topic:
        unknown_job(bootstrap, status_topic, topic, keep.job)
    return code


def unknown_job(bootstrap: str, status_topic: str, topic: str, job: str) -> None:
    """Raise NotFoundError (exit 7) naming jobs close to `job`, unless the processors report
    `job` on the status topic (a job without decisions yet is no mistake)."""
    import asyncio

    from faultwatch.core.names import did_you_mean
    from faultwatch.errors import NotFoundError
    from faultwatch.kafka.reading import read_topic
    from faultwatch.readers.status import read_snapshots

    jobs = set(asyncio.run(read_snapshots(bootstrap, status_topic, must_exist=False)))
    if job in jobs:
        return

    async def decided() -> set[str]:  # the jobs with decisions (keyed by job), to suggest
        return {msg.key.decode(errors="replace") async for msg, _ in read_topic(
            bootstrap, topic, decoder=lambda v: None) if msg.key}

    jobs |= asyncio.run(decided())
    if job in jobs:  # its first decision came while we read: known after all
        return
    raise NotFoundError(f"no decision of job {job!r} on {topic}, and no processor reports "
                        f"it{did_you_mean(job, jobs)} (`faultwatch status` lists the jobs)")
