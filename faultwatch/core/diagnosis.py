"""Hang diagnosis in the job state: the agents' answers (every rank's stack and Flight
Recorder dump) and what they say about a silence: who did not join, who writes a checkpoint.

The protocol, the same in embedded and cluster mode: when every rank has been silent for
`diagnose_at` of the window, the job stage publishes a `notify` decision of kind `diagnose`
(silence.py); every agent that follows decisions captures its ranks (py-spy, else the SDK's
own dump; the Flight Recorder when the SDK armed it) and ships a `diagnosis` note; the hang
decision at the window reads the answers given since the silence began.
"""

from __future__ import annotations

import dataclasses
import json
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from faultwatch.core.events import Notice
from faultwatch.core.state import JobState, freeze, thaw
from faultwatch.dumps import flight_recorder, stacks

DIAGNOSE_KIND = "diagnose"  # the notify decision the agents act on
DIAGNOSIS_NOTE = "diagnosis"  # the note they answer with
ANSWER_WAIT_S = 10.0  # at the window, wait this long at most for answers still coming
MAX_RANKS_PER_NOTE = 256
MAX_FR_CHARS = 200_000  # one rank's trimmed dump, as JSON text


def is_probe(dec: Any) -> bool:
    """A diagnosis request (a `notify` of kind `diagnose`): control traffic for the agents,
    published on <prefix>control, never on the decisions topic people and schedulers read."""
    return getattr(dec, "action", None) == "notify" and getattr(dec, "kind", None) == DIAGNOSE_KIND


def probes_evidence(sent: tuple[tuple[str, float, float], ...],
                    answers: Mapping[str, Mapping[str, Any]], since: float) -> dict[str, Any]:
    """What a hang's evidence says of the probes of its silence: which were sent (id, event
    time, the deadline each was for) and which nodes answered which request, how many ranks."""
    mine = [(i, at, f) for i, at, f in sent if at >= since]
    return {"sent": [{"id": i, "ts": at, "for": f} for i, at, f in mine],
            "answered": {node: {"request": a.get("request"), "ts": a.get("ts"),
                                "ranks": len(a.get("ranks", {}))}
                         for node, a in sorted(answers.items())}}


@dataclass(frozen=True)
class Verdict:
    """What the answers say: the culprits, on what basis, in a sentence; checkpoint writers."""

    culprits: tuple[int, ...]
    basis: str  # "flight recorder", "stacks" or "" (no culprit found)
    sentence: str
    checkpoint: tuple[int, ...] = ()
    checkpoint_at: str = ""
    nodes_of: dict[int, str] = field(default_factory=dict)
    evidence: dict[str, Any] = field(default_factory=dict)


def _cpu(d: Mapping[str, Any]) -> float | None:
    c = d.get("cpu_s")
    return float(c) if isinstance(c, int | float) and math.isfinite(c) and c >= 0 else None


def fold_answer(st: JobState, ev: Notice) -> JobState:
    """Keep a node's latest answer (attempt-scoped; output resuming clears them), and since
    when its ranks' stacks have not changed: `same_since` is the time of the first of the
    consecutive answers whose stack digests all equal this one's, `base_cpu` the ranks' CPU
    seconds at that capture (stacks.py digests carry no addresses or times, so equal digests
    mean the same code location and state)."""
    ranks = ev.data.get("ranks")
    if not isinstance(ranks, Mapping):
        return st
    kept = {}
    for r, d in list(ranks.items())[:MAX_RANKS_PER_NOTE]:
        if isinstance(d, Mapping) and str(r).isdigit():
            fr = d.get("fr")
            ps = d.get("proc_state")
            frac = d.get("cpu_frac")
            kids = d.get("workers_running")
            kept[str(int(str(r)))] = {
                "stack": d.get("stack") if isinstance(d.get("stack"), Mapping) else None,
                "fr": fr if isinstance(fr, str) and len(fr) <= MAX_FR_CHARS else None,
                "source": str(d.get("source", ""))[:32], "cpu_s": _cpu(d),
                "proc_state": ps[:1] if isinstance(ps, str) and ps else None,
                "cpu_frac": float(frac) if isinstance(frac, int | float)
                and math.isfinite(frac) and frac >= 0 else None,
                "workers_running": min(kids, 10_000) if isinstance(kids, int)
                and not isinstance(kids, bool) and kids > 0 else 0}
    errors = ev.data.get("errors")
    answer: dict[str, Any] = {
        "ts": ev.ts, "request": str(ev.data.get("request", ""))[:64], "ranks": kept,
        "errors": {str(k): str(v)[:300] for k, v in list(errors.items())[:64]}
        if isinstance(errors, Mapping) else {}}
    digests = {r: d["stack"] for r, d in kept.items()}
    prev = st.diagnoses.get(ev.node)
    old = thaw(prev) if prev is not None else None
    if old is not None and old.get("ts", ev.ts) < ev.ts:  # CPU used since the last capture
        for r, d in kept.items():
            was = old.get("ranks", {}).get(r, {}).get("cpu_s")
            if was is not None and d["cpu_s"] is not None:
                d["cpu_rate"] = round(max(0.0, d["cpu_s"] - was) / (ev.ts - old["ts"]), 3)
    if old is not None and old.get("ts", ev.ts) <= ev.ts and digests and all(digests.values()) \
            and {r: d.get("stack") for r, d in old.get("ranks", {}).items()} == digests:
        answer["same_since"] = old.get("same_since", old["ts"])
        answer["base_cpu"] = old.get("base_cpu", {})
    else:
        answer["same_since"] = ev.ts
        answer["base_cpu"] = {r: d["cpu_s"] for r, d in kept.items()}
    return dataclasses.replace(st, diagnoses=st.diagnoses.set(ev.node, freeze(answer)))


IDLE_CPU_FRACTION = 0.1  # a rank using less than this of a core between captures made no progress


def unchanged_for(answers: Mapping[str, Mapping[str, Any]], since: float,
                  culprits: tuple[int, ...]) -> tuple[float, dict[str, Any]]:
    """How long every answering node's stacks have stayed the same during the silence that
    began at `since`, requiring the culprits to be off CPU in those stacks (py-spy's idle
    flag) and to have used almost no CPU between the first and the last capture: a rank
    busy at one line may be computing (a long kernel), not stuck. (0, why) otherwise."""
    spans = []
    cpu: dict[str, float] = {}
    for node, a in answers.items():
        first = max(float(a.get("same_since", a["ts"])), since)
        span = float(a["ts"]) - first
        for r, d in a.get("ranks", {}).items():
            if int(r) not in culprits:
                continue
            stack = d.get("stack") or {}
            if stack.get("idle") is not True:
                return 0.0, {"why": f"rank {r} ({node}) is not known to be idle"}
            base, now = a.get("base_cpu", {}).get(r), d.get("cpu_s")
            if base is None or now is None:
                return 0.0, {"why": f"no CPU time for rank {r} ({node})"}
            used = float(now) - float(base)
            if span > 0 and used > IDLE_CPU_FRACTION * span:
                return 0.0, {"why": f"rank {r} used {used:.1f}s of CPU in {span:.0f}s"}
            cpu[r] = round(used, 3)
        spans.append(span)
    if not spans:
        return 0.0, {"why": "no answers"}
    return min(spans), {"culprit_cpu_s": cpu, "captures_span_s": round(min(spans), 3)}


def answers_since(st: JobState, since: float) -> dict[str, dict[str, Any]]:
    """node -> answer, for answers captured at or after `since` (the silence's start)."""
    return {node: thaw(a) for node, a in st.diagnoses.items() if a["ts"] >= since}


def verdict(answers: Mapping[str, Mapping[str, Any]]) -> Verdict | None:
    """Compare every answered rank across nodes; None when no rank was captured."""
    acts: dict[int, stacks.RankActivity] = {}
    dumps: dict[int, dict[str, Any]] = {}
    nodes_of: dict[int, str] = {}
    errors: dict[str, str] = {}
    for node, a in sorted(answers.items()):
        for r, d in a.get("ranks", {}).items():
            rank = int(r)
            nodes_of[rank] = node
            if d.get("stack"):
                acts[rank] = stacks.RankActivity.from_dict(rank, d["stack"])
            if d.get("fr"):
                try:
                    dump = json.loads(d["fr"])
                except ValueError:
                    continue
                if isinstance(dump, dict):
                    dumps[rank] = dump
        errors.update({f"{node}/rank{k}": v for k, v in a.get("errors", {}).items()})
    if not acts and not dumps:
        return None
    found = stacks.compare(acts)
    fr = flight_recorder.analyse(dumps) if len(dumps) >= 2 else None
    ev: dict[str, Any] = {"nodes_answered": sorted(answers), "stacks": found.to_dict()}
    if fr is not None:
        ev["flight_recorder"] = fr.to_dict()
    if errors:
        ev["capture_errors"] = dict(list(errors.items())[:16])
    ckpt = found.in_checkpoint
    ckpt_at = "; ".join(f"rank {r} at {_innermost(found.ranks[r])}" for r in ckpt[:4])
    if fr is not None and fr.culprits:
        where = [f"rank {r} is at {_where(acts[r])}" for r in fr.culprits[:4]
                 if r in acts and acts[r].at]
        sentence = "; ".join([fr.summary, *where])
        return Verdict(fr.culprits, "flight recorder", sentence, ckpt, ckpt_at, nodes_of, ev)
    if found.culprits:
        return Verdict(found.culprits, "stacks", found.summary, ckpt, ckpt_at, nodes_of, ev)
    summary = found.summary if fr is None or not fr.groups else f"{fr.summary}; {found.summary}"
    return Verdict((), "", summary, ckpt, ckpt_at, nodes_of, ev)


def _innermost(a: stacks.RankActivity) -> str:
    return a.frames[0] if a.frames else a.at or "?"


def _where(a: stacks.RankActivity) -> str:
    """The user's frame, and the innermost one when that is elsewhere (a library call)."""
    inner = _innermost(a)
    return f"{a.at} in {inner}" if a.at and inner != a.at else inner


# ---- positive evidence: do the ranks wait for each other? ------------------------------------

WAIT, STUCK, NONE = "wait", "stuck", "none"


@dataclass(frozen=True)
class Assessment:
    """What the answers prove about a silence (docs/hangs.md has the table):

    - `wait`: ranks wait for each other — a rank inside a collective while the ranks it waits
      for are elsewhere and blocked, Flight Recorder entries that disagree, or every rank in a
      collective with stacks unchanged between captures;
    - `stuck`: no rank communicates, and every rank has sat blocked at an unchanged stack,
      using no CPU, for the required span (a deadlock in every rank);
    - `none`: no such evidence (no answers; or a rank works: on CPU, in I/O, compiling,
      writing a checkpoint): a silence, not a proven hang.
    `ranks` says per rank what it does, `sentence` in words."""

    kind: str
    culprits: tuple[int, ...]
    sentence: str
    ranks: dict[str, dict[str, Any]] = field(default_factory=dict)
    detail: dict[str, Any] = field(default_factory=dict)


def _working(d: Mapping[str, Any], act: stacks.RankActivity) -> str | None:
    """Why a rank counts as working (making progress toward something), or None: blocked."""
    if act.state in stacks.WORKING:
        return stacks.WHAT[act.state]
    if act.others:
        return f"thread {act.others[0]}"
    ps = d.get("proc_state")
    if ps == "D":
        return "in uninterruptible I/O (state D)"
    if act.idle is False or ps == "R":
        return "on CPU"
    if d.get("workers_running"):
        return f"{d['workers_running']} worker process(es) on CPU or in I/O"
    for key, what in (("cpu_rate", "between captures"), ("cpu_frac", "while captured")):
        used = d.get(key)
        if isinstance(used, int | float) and used >= IDLE_CPU_FRACTION:
            return f"used {used:.0%} of a core {what}"
    return None


def rank_activity(answers: Mapping[str, Mapping[str, Any]]
                  ) -> dict[int, tuple[stacks.RankActivity, str | None, Mapping[str, Any]]]:
    """rank -> (activity, why it counts as working or None, the rank's answer) for every
    captured rank."""
    out = {}
    for _node, a in sorted(answers.items()):
        for r, d in a.get("ranks", {}).items():
            if d.get("stack"):
                act = stacks.RankActivity.from_dict(int(r), d["stack"])
                out[int(r)] = (act, _working(d, act), d)
    return out


def describe_ranks(acts: Mapping[int, tuple[stacks.RankActivity, str | None, Any]],
                   limit: int = 4) -> str:
    """"rank 0 at save.py:12 in upload (in I/O); rank 1 at train.py:40 in step (in user code,
    blocked)" — what a notice and a decision say each rank does."""
    parts = []
    for r, (act, why, _d) in sorted(acts.items())[:limit]:
        what = stacks.WHAT.get(act.state, act.state)
        if act.state == stacks.COLLECTIVE and act.op:
            what = f"in {act.op}"
        how = why if why is not None and why != what else ("blocked" if why is None else "")
        parts.append(f"rank {r} at {act.at or '?'} ({what}{', ' + how if how else ''})")
    if len(acts) > limit:
        parts.append(f"{len(acts) - limit} more rank(s)")
    return "; ".join(parts)


def assess(answers: Mapping[str, Mapping[str, Any]], found: Verdict | None,
           silent_since: float, stuck_s: float) -> Assessment:
    """The evidence the answers given since `silent_since` hold (see Assessment)."""
    acts = rank_activity(answers)
    ranks = {str(r): {"state": a.state, "at": a.at, "working": why}
             for r, (a, why, _d) in sorted(acts.items())[:64]}
    said = describe_ranks(acts)
    if found is None or not acts and found.basis != "flight recorder":
        return Assessment(NONE, (), "no rank's stack was captured", ranks)
    fr = found.evidence.get("flight_recorder") or {}
    mismatched = [g["group"] for g in fr.get("groups", ()) if g.get("mismatches")]
    if mismatched:
        return Assessment(WAIT, found.culprits, found.sentence, ranks,
                          {"by": "flight recorder mismatch", "groups": mismatched[:8]})
    if found.culprits:  # the FR or the stacks name ranks the others wait for
        busy = {r: acts[r][1] for r in found.culprits if r in acts and acts[r][1] is not None}
        if not busy:
            return Assessment(WAIT, found.culprits, found.sentence, ranks,
                              {"by": found.basis})
        r, why = next(iter(sorted(busy.items())))
        return Assessment(NONE, (), f"ranks wait for rank {r}, which works ({why}): {said}",
                          ranks, {"waiting_for": sorted(busy)})
    coll = [r for r, (a, _w, _d) in acts.items() if a.state == stacks.COLLECTIVE]
    if coll and len(coll) == len(acts) >= 2:
        moved = [node for node, a in answers.items()
                 if float(a.get("same_since", a["ts"])) >= float(a["ts"])]
        if not moved:
            return Assessment(WAIT, (), f"every rank waits in a collective, stacks unchanged "
                                        f"between captures: {said}", ranks,
                              {"by": "every rank in a collective"})
        return Assessment(NONE, (), f"every rank in a collective (one capture so far): {said}",
                          ranks)
    working = {r: why for r, (_a, why, _d) in acts.items() if why is not None}
    if not coll and not working:
        everyone = tuple(sorted(acts))
        span, detail = unchanged_for(answers, silent_since, everyone)
        if span >= stuck_s:
            return Assessment(STUCK, everyone, f"no rank is inside a collective; every rank "
                                               f"blocked at an unchanged stack for "
                                               f"{span:.0f}s: {said}", ranks, detail)
        return Assessment(NONE, (), f"no rank waits for another: {said}", ranks,
                          {"unchanged_s": round(span, 3), "stuck_s": stuck_s, **detail})
    return Assessment(NONE, (), f"no rank waits for another: {said}", ranks,
                      {"working": {str(r): w for r, w in sorted(working.items())[:16]}})
