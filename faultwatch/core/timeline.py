"""The ledger's folds: a job's signals and decisions, in event time, into its run's ledger
(attempts started and ended, progress marks, checkpoint and eval spans, incidents)."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

from faultwatch.core.events import Decision, Exit, Progress, ProgressBatch, RunStart, Signal, Stage
from faultwatch.core.goodput import summarise as summarise_attempt
from faultwatch.core.incidents import open_incident
from faultwatch.core.ledger import (
    MAX_ATTEMPTS,
    MAX_INCIDENTS,
    MAX_NODES,
    MAX_OPEN_RANKS,
    MAX_SAMPLES,
    MAX_SPANS,
    Attempt,
    Checkpoint,
    Incident,
    Ledger,
    OpenStage,
    is_save,
    stage_kind,
)
from faultwatch.core.state import JobState, evolve

ENDING_ACTIONS = ("restart", "blacklist", "fail")
RELEVANT = (RunStart, Exit, Progress, ProgressBatch, Stage)
PROGRESS = (Progress, ProgressBatch)
# _progress builds an Attempt positionally: its fields, in this order
if Attempt._fields != ("n", "launch_ts", "node_count", "end_ts", "exits", "stopped",
                       "first_step_ts", "first_step", "last_step_ts", "last_step", "top_step",
                       "open", "spans", "spans_s"):
    raise AssertionError("ledger.Attempt's fields changed: update timeline._progress")
# sums an attempt that leaves the detail window (its account is final once a later one
# started): goodput.attempt_parts
Summarise = Callable[[Ledger, Attempt, Attempt], Mapping[str, float]]


def relevant(sigs: Iterable[Signal], decs: Sequence[Decision] = ()) -> bool:
    """Whether `sigs`/`decs` change a ledger (outputs, heartbeats, hits and notices alone do
    not)."""
    return any(d.action in ENDING_ACTIONS or held(d) for d in decs) \
        or any(isinstance(s, RELEVANT) for s in sigs)


def fold_job(prev: JobState | None, st: JobState, sigs: Sequence[Signal],
             decs: Sequence[Decision]) -> JobState:
    """`st`, the job's state after one record's `sigs` and the decisions `decs` they led to,
    with its run's ledger folded too. A record that began a new run (`prev` is the old one's
    state) is folded from the new run's run-start on."""
    if not relevant(sigs, decs):
        return st
    if prev is not None and st.run_id != prev.run_id:
        k = next((i for i, s in enumerate(sigs) if isinstance(s, RunStart)
                  and s.run_id == st.run_id), 0)
        sigs = sigs[k:]
    led = st.ledger
    new = observe(led, sigs, decs, lambda r: rank_node(st, r), summarise_attempt)
    return st if new is led else evolve(st, ledger=new)


def rank_node(st: JobState, rank: int) -> str | None:
    """The node a rank ran on this attempt (its progress, or a node's run-start rank)."""
    p = st.progress.get(rank)
    if p is not None and p.node:
        return str(p.node)
    return next((n.node for n in st.nodes.values() if n.rank == rank), None)


def observe(led: Ledger, sigs: Sequence[Signal], decs: Sequence[Decision],
            rank_nodes: Callable[[int], str | None] | None = None,
            summarise: Summarise | None = None) -> Ledger:
    """The ledger with one record's signals (in order) and the decisions they led to folded
    in. `rank_nodes` names a rank's node (a hang's culprit); `summarise` sums an attempt that
    leaves the detail window (goodput.attempt_parts)."""
    events: list[Any] = [s for s in sigs if isinstance(s, RELEVANT)]
    if any(isinstance(e, Stage) for e in events):  # a step and a stage of one batch: by time
        events = sorted(_marks(events), key=_ts)
    i, n = 0, len(events)
    while i < n:
        ev = events[i]
        cur = led.current
        if isinstance(ev, PROGRESS) and cur is not None and ev.attempt == cur.n:
            # a run of progress (a batch of marks, or one Progress a mark as older matcher
            # stages sent them) is folded at once: both forms give the same ledger
            marks: list[tuple[float, int]] = []
            while i < n and isinstance(events[i], PROGRESS) and events[i].attempt == cur.n:
                p = events[i]
                marks += [(m.ts, m.step) for m in p.marks] if isinstance(p, ProgressBatch) \
                    else [(p.ts, p.step)]
                i += 1
            if marks:
                led = _progress(led, cur, marks)
            continue
        led = _fold(led, ev, summarise)
        i += 1
    for d in decs:
        led = _decide(led, d, rank_nodes)
    return led


def _marks(events: list[Any]) -> Iterable[Any]:
    for e in events:
        if isinstance(e, ProgressBatch):
            yield from (Progress(e.job, e.attempt, e.node, m.ts, m.rank, m.step, m.total,
                                 run_id=e.run_id) for m in e.marks)
        else:
            yield e


def _ts(e: Any) -> float:
    return float(e.ts)


def _replace(led: Ledger, **changes: Any) -> Ledger:
    """dataclasses.replace without __init__ (the ledger is folded once per record)."""
    new = object.__new__(Ledger)
    new.__dict__.update(led.__dict__)
    new.__dict__.update(changes)
    return new


def _with(led: Ledger, attempt: Attempt, *, rev: bool = False, **changes: Any) -> Ledger:
    """The ledger with its current attempt replaced (and `changes`)."""
    return _replace(led, attempts=led.attempts[:-1] + (attempt,),
                    rev=led.rev + 1 if rev else led.rev, **changes)


def _later(a: float | None, b: float) -> float:
    return b if a is None or b > a else a


def _fold(led: Ledger, ev: Any, summarise: Summarise | None) -> Ledger:
    if isinstance(ev, RunStart):
        return _start(led, ev, summarise)
    cur = led.current
    if cur is None or ev.attempt != cur.n:
        return led  # before any run-start, or a late record of an earlier attempt
    if isinstance(ev, Progress):
        return _progress(led, cur, ((ev.ts, ev.step),))
    if isinstance(ev, ProgressBatch):
        return _progress(led, cur, [(m.ts, m.step) for m in ev.marks]) if ev.marks else led
    if isinstance(ev, Stage):
        return _stage(led, cur, ev)
    if isinstance(ev, Exit):
        return _exit(led, cur, ev)
    return led


def _start(led: Ledger, ev: RunStart, summarise: Summarise | None) -> Ledger:
    cur = led.current
    nodes, total = led.nodes, led.node_total
    if ev.node not in nodes:
        total += 1
        if len(nodes) < MAX_NODES:
            nodes = nodes + (ev.node,)
    first = ev.ts if led.first_ts is None else min(led.first_ts, ev.ts)
    last = _later(led.last_ts, ev.ts)
    head: dict[str, Any] = {"job": led.job or ev.job, "run_id": led.run_id or ev.run_id}
    if cur is not None and ev.attempt == cur.n:
        a = cur._replace(launch_ts=min(cur.launch_ts, ev.ts), node_count=cur.node_count + 1)
        return _with(led, a, nodes=nodes, node_total=total, first_ts=first, last_ts=last,
                     **head)
    if cur is not None and ev.attempt < cur.n:
        return led  # a late run-start of an earlier attempt
    incidents = tuple(i._replace(acted_ts=ev.ts) if i.acted_ts is None and i.restarts
                      and i.attempt < ev.attempt else i for i in led.incidents)
    attempts = led.attempts + (Attempt(n=ev.attempt, launch_ts=ev.ts, node_count=1),)
    earlier, dropped = dict(led.earlier), led.earlier_attempts
    while len(attempts) > MAX_ATTEMPTS:
        if summarise is not None:
            for k, v in summarise(led, attempts[0], attempts[1]).items():
                earlier[k] = earlier.get(k, 0.0) + v
        attempts, dropped = attempts[1:], dropped + 1
    return _replace(led, attempts=attempts, incidents=incidents, nodes=nodes, node_total=total,
                    first_ts=first, last_ts=last, earlier=tuple(earlier.items()),
                    earlier_attempts=dropped,
                    rev=led.rev + 1, **head)


def _progress(led: Ledger, cur: Attempt, marks: Iterable[tuple[float, int]]) -> Ledger:
    """Progress marks (ts, step) of one record, folded at once (one copy of the ledger)."""
    first = cur.first_step_ts is None
    first_ts, first_step = cur.first_step_ts, cur.first_step
    last_ts, last_step, top = cur.last_step_ts, cur.last_step, cur.top_step
    newest = led.last_ts
    # one sample every `stride` marks (not every call): the samples do not depend on how
    # the marks were batched into records or the stage's batches
    samples, stride, skipped = led.samples, led.stride, led.skipped
    opening = first  # the attempt's first mark is always sampled
    for ts, step in marks:
        if first_ts is None:
            first_ts, first_step = ts, step
        if last_ts is None or ts >= last_ts:
            last_ts, last_step = ts, step
        if top is None or step > top:
            top = step
        if newest is None or ts > newest:
            newest = ts
        skipped += 1
        if (opening or skipped >= stride) and last_step is not None:
            opening = False
            samples, skipped = samples + ((last_ts, last_step, cur.n),), 0
            if len(samples) > MAX_SAMPLES:  # thin by halves: every other one, twice the stride
                samples, stride = samples[::2], stride * 2
    assert first_ts is not None and last_ts is not None and last_step is not None
    # (a tuple built in place: NamedTuple._replace goes through a dict, once a record)
    a = tuple.__new__(Attempt, (cur.n, cur.launch_ts, cur.node_count, cur.end_ts, cur.exits,
                                cur.stopped, first_ts, first_step, last_ts, last_step, top,
                                cur.open, cur.spans, cur.spans_s))
    incidents = led.incidents
    if first:  # the first progress after a restart: the incidents before it are recovered
        incidents = tuple(i._replace(recovered_ts=first_ts) if i.recovered_ts is None
                          and i.attempt < cur.n and i.restarts else i for i in incidents)
    elif incidents and incidents[-1].attempt == cur.n and top is not None:
        inc = incidents[-1]  # steps after the failure's decision (other ranks go on until
        if inc.ckpt_step is not None and inc.lost_steps is not None \
                and top - inc.ckpt_step > inc.lost_steps:  # they are stopped) are lost too
            incidents = incidents[:-1] + (inc._replace(lost_steps=top - inc.ckpt_step),)
    return _with(led, a, rev=first, samples=samples, stride=stride, skipped=skipped,
                 incidents=incidents, last_ts=newest)


def _stage(led: Ledger, cur: Attempt, ev: Stage) -> Ledger:
    last = _later(led.last_ts, ev.ts)
    kind = stage_kind(ev.stage)
    if kind is None:
        return _replace(led, last_ts=last)
    rank = -1 if ev.rank is None else ev.rank
    step = getattr(ev, "step", None)
    opened = next((o for o in cur.open if o.kind == kind), None)
    others = tuple(o for o in cur.open if o.kind != kind)
    if ev.opens:
        if opened is None:
            o = OpenStage(kind, ev.ts, frozenset((rank,)), step)
        elif rank in opened.ranks or len(opened.ranks) >= MAX_OPEN_RANKS:
            return _replace(led, last_ts=last)
        else:
            o = opened._replace(ranks=opened.ranks | {rank},
                                step=opened.step if opened.step is not None else step)
        return _with(led, cur._replace(open=others + (o,)), last_ts=last)
    if opened is None or rank not in opened.ranks:
        return _replace(led, last_ts=last)
    left = opened.ranks - {rank}
    if left:
        return _with(led, cur._replace(open=others + (opened._replace(ranks=left),)),
                     last_ts=last)
    spans = cur.spans + ((kind, opened.since, max(opened.since, ev.ts)),)
    spans_s = cur.spans_s
    if len(spans) > MAX_SPANS:
        k, s, e = spans[0]
        spans_s = _add(spans_s, k, e - s)
        spans = spans[1:]
    a = cur._replace(open=others, spans=spans, spans_s=spans_s)
    ckpt = led.ckpt
    if is_save(ev.stage):
        if step is None:
            step = opened.step
        if step is None and cur.last_step_ts is not None and cur.last_step_ts <= ev.ts:
            step = cur.last_step  # the last step before it completed
        ckpt = Checkpoint(step, ev.ts, cur.n)
    return _with(led, a, rev=ckpt is not led.ckpt, ckpt=ckpt, last_ts=last)


def _add(pairs: tuple[tuple[str, float], ...], kind: str, secs: float
         ) -> tuple[tuple[str, float], ...]:
    d = dict(pairs)
    d[kind] = d.get(kind, 0.0) + max(0.0, secs)
    return tuple(d.items())


def _exit(led: Ledger, cur: Attempt, ev: Exit) -> Ledger:
    a = cur._replace(end_ts=_later(cur.end_ts, ev.ts), exits=cur.exits + 1,
                     stopped=cur.stopped or ev.stopped)
    led = _with(led, a, rev=True, last_ts=_later(led.last_ts, ev.ts))
    if ev.stopped and led.incident_of(cur.n) is None:  # an operator's stop ends the attempt
        led = _add_incident(led, open_incident(led.ckpt, a, None, ev))
    return led


def held(d: Decision) -> bool:
    """A decision an operator's hold turned into a notice (core/holds.py): it ended the
    attempt all the same, and the job waits for the operator."""
    return d.action == "notify" and isinstance(d.evidence, dict) \
        and isinstance(d.evidence.get("held"), dict)


def _decide(led: Ledger, d: Decision, rank_nodes: Callable[[int], str | None] | None) -> Ledger:
    if d.action not in ENDING_ACTIONS and not held(d):
        return led  # notices end nothing
    a = next((x for x in reversed(led.attempts) if x.n == d.attempt), None)
    if a is None or led.incident_of(d.attempt) is not None:
        return led  # the attempt's first decision opened its incident
    led = _replace(led, last_ts=_later(led.last_ts, d.ts))
    return _add_incident(led, open_incident(led.ckpt, a, d, None, rank_nodes))


def _add_incident(led: Ledger, inc: Incident) -> Ledger:
    incidents = led.incidents + (inc,)
    dropped = led.incidents_dropped
    if len(incidents) > MAX_INCIDENTS:
        incidents, dropped = incidents[1:], dropped + 1
    return _replace(led, incidents=incidents, incidents_dropped=dropped, rev=led.rev + 1)
