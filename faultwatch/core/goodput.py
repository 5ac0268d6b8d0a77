"""Goodput: a run's wall time split into productive time and badput by cause (pure).

Wall time runs from the first launch of the job's command to the end of its last attempt.
Each attempt, from its launch to the next one's, is cut at points clamped into order:

    launch -> first progress -> failure's first sign -> decision -> next launch
    startup    training          hang silence /         restart / waiting
    (restart)  (productive,      detection delay
               checkpoint, eval,
               lost work)

so the parts sum to wall time exactly; a point out of order (clock skew between nodes, a
decision stamped before its first sign) is clamped and counted. ETTR = productive / wall
(Kokolis et al., HPCA 2025); the vocabulary of goodput and badput is Google's
ml-goodput-measurement's. docs/goodput.md defines each part.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from faultwatch.core.ledger import CHECKPOINT, Attempt, Ledger, covered, training_s

PARTS = ("startup", "checkpoint", "eval", "hang_silence", "detection", "restart", "lost_work",
         "waiting", "other")
LABELS = {"startup": "start-up", "checkpoint": "checkpoint", "eval": "eval",
          "hang_silence": "hang silence", "detection": "detection", "restart": "restart",
          "lost_work": "lost work", "waiting": "waiting", "other": "other"}
PRODUCTIVE = "productive"
NODE_S = "node_s"  # node-seconds (not a part: incidents per 1,000 node-hours)
CLAMPED = "clamped"  # points clamped into order (not a part)
# after these the relaunch waits for something outside the job: another node, the
# scheduler's requeue, an operator's resume
WAITING_CAUSES = ("node-lost", "preemption", "operator-stop")
EPS_S = 1e-3  # a point out of order by less than this is not counted as clamped
MIN_MEASURED_S = 1.0  # shorter runs get no goodput line (their ratio is noise)


@dataclass(frozen=True)
class Account:
    """A run's time account (seconds). `ratio` is None when no progress was ever seen
    (goodput unknown, not 0 or 100 %); `upper_bound` when some incident's lost work is
    unknown (no checkpoint seen): that time was counted productive."""

    wall_s: float
    productive_s: float
    badput: Mapping[str, float]
    ratio: float | None
    upper_bound: bool = False
    lost_unknown: int = 0
    clamped: int = 0
    incidents: int = 0
    start_ts: float | None = None
    end_ts: float | None = None
    node_s: float = 0.0
    extra: Mapping[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {"wall_s": round(self.wall_s, 3), "productive_s": round(self.productive_s, 3),
                "badput_s": {k: round(v, 3) for k, v in self.badput.items()},
                "ratio": None if self.ratio is None else round(self.ratio, 5),
                "upper_bound": self.upper_bound, "lost_unknown": self.lost_unknown,
                "clamped": self.clamped, "incidents": self.incidents,
                "start_ts": self.start_ts, "end_ts": self.end_ts,
                "node_s": round(self.node_s, 3)}

    def line(self) -> str:
        """`goodput 91.2 % of 2h13m: 7m04s restart, 3m10s lost work, ...`"""
        if self.wall_s < MIN_MEASURED_S:  # a ratio of a blink says nothing
            return f"goodput not measured: the run lasted {fmt_s(self.wall_s)}"
        parts = sorted(((v, k) for k, v in self.badput.items() if v >= 0.05), reverse=True)
        spent = ", ".join(f"{fmt_s(v)} {LABELS[k]}" for v, k in parts) or "no badput"
        if self.ratio is None:
            return f"goodput unknown (no training progress seen) of {fmt_s(self.wall_s)}: {spent}"
        head = "<= " if self.upper_bound else ""
        tail = f" (lost work unknown for {self.lost_unknown} incident(s): no checkpoint seen)" \
            if self.upper_bound else ""
        return f"goodput {head}{self.ratio * 100:.1f} % of {fmt_s(self.wall_s)}: {spent}{tail}"


def fmt_s(s: float) -> str:
    """2h13m, 7m04s, 3.2s."""
    if s < 60:
        return f"{s:.1f}s"
    s = int(round(s))
    if s < 3600:
        return f"{s // 60}m{s % 60:02d}s"
    return f"{s // 3600}h{s % 3600 // 60:02d}m"


class _Cut:
    """Points of one attempt clamped into order, counting those out of order."""

    def __init__(self, lo: float, hi: float) -> None:
        self.at, self.hi, self.clamped = lo, hi, 0

    def next(self, x: float | None) -> float:
        """`x` clamped into [the previous point, the attempt's end]; None: the previous."""
        if x is None:
            return self.at
        if x < self.at - EPS_S or x > self.hi + EPS_S:
            self.clamped += 1
        self.at = min(max(x, self.at), self.hi)
        return self.at


def attempt_parts(led: Ledger, a: Attempt, nxt: Attempt | None,
                  end: float | None = None) -> dict[str, float]:
    """The seconds of attempt `a` by part, from its launch to `nxt`'s launch (or `end`, for
    the last attempt), with NODE_S and CLAMPED beside them."""
    hi = nxt.launch_ts if nxt is not None else (end if end is not None else a.launch_ts)
    hi = max(hi, a.launch_ts)
    out = dict.fromkeys((PRODUCTIVE, *PARTS), 0.0)
    out[NODE_S] = (hi - a.launch_ts) * max(1, a.node_count)
    cut = _Cut(a.launch_ts, hi)
    inc = led.incident_of(a.n)
    first = a.n == led.attempts[0].n and not led.earlier_attempts
    ended = a.end_ts is not None and a.exits >= a.node_count
    first_step = a.first_step_ts
    if inc is not None and (first_step is None or first_step > inc.first_sign_ts):
        first_step = inc.first_sign_ts  # it failed before it made progress
    start = cut.next(first_step if first_step is not None else hi)
    out["startup" if first else "restart"] += start - a.launch_ts
    if inc is not None:
        stop = cut.next(inc.first_sign_ts)
    elif ended and a.last_step_ts is not None:
        stop = cut.next(a.last_step_ts)  # after the last step: the job's own teardown
    else:
        stop = hi  # still training (or never did): up to the latest event
    spans = a.all_spans(hi)
    in_ckpt = covered([s for s in spans if s[0] == CHECKPOINT], start, stop)
    in_stage = covered(spans, start, stop)
    lost = 0.0
    if inc is not None and inc.lost_known and inc.ckpt_ts is not None:
        lost = training_s(a, max(inc.ckpt_ts, start), stop)
    out["checkpoint"] += in_ckpt
    out["eval"] += in_stage - in_ckpt
    out["lost_work"] += lost
    out[PRODUCTIVE] += max(0.0, (stop - start) - in_stage - lost)
    if inc is None:
        tail_ckpt = covered([s for s in spans if s[0] == CHECKPOINT], stop, hi)
        tail_stage = covered(spans, stop, hi)
        out["checkpoint"] += tail_ckpt
        out["eval"] += tail_stage - tail_ckpt
        out["other"] += (hi - stop) - tail_stage
    else:
        decided = cut.next(inc.detected_ts)
        out["hang_silence" if inc.cause == "hang" else "detection"] += decided - stop
        after = "other" if not inc.restarts and nxt is None else \
            "waiting" if inc.cause in WAITING_CAUSES or inc.action == "blacklist" else "restart"
        out[after] += hi - decided
    out[CLAMPED] = float(cut.clamped)
    return out


def summarise(led: Ledger, a: Attempt, nxt: Attempt) -> dict[str, float]:
    """timeline.Summarise: an attempt's final parts, when it leaves the ledger's detail."""
    return attempt_parts(led, a, nxt)


def account(led: Ledger, now: float | None = None) -> Account:
    """The run's account up to its latest event (or `now`, when later: a running job)."""
    if not led.attempts:
        return Account(0.0, 0.0, dict.fromkeys(PARTS, 0.0), None)
    last = led.attempts[-1]
    end = max(x for x in (led.last_ts, last.end_ts, last.launch_ts) if x is not None)
    running = last.end_ts is None or last.exits < last.node_count
    if now is not None and running:
        end = max(end, now)
    totals = {k: led.earlier_s(k) for k in (PRODUCTIVE, *PARTS, NODE_S, CLAMPED)}
    for a, nxt in zip(led.attempts, (*led.attempts[1:], None), strict=True):
        for k, v in attempt_parts(led, a, nxt, end).items():
            totals[k] += v
    progress = any(a.first_step_ts is not None for a in led.attempts) \
        or led.earlier_s(PRODUCTIVE) > 0
    badput = {k: totals[k] for k in PARTS}
    wall = totals[PRODUCTIVE] + sum(badput.values())
    unknown = sum(1 for i in led.incidents if not i.lost_known)
    ratio = totals[PRODUCTIVE] / wall if progress and wall > 0 else None
    return Account(wall, totals[PRODUCTIVE], badput, ratio, upper_bound=unknown > 0
                   and ratio is not None, lost_unknown=unknown, clamped=int(totals[CLAMPED]),
                   incidents=len(led.incidents) + led.incidents_dropped,
                   start_ts=led.first_ts, end_ts=end, node_s=totals[NODE_S])


# ---- the fleet ------------------------------------------------------------------------------

def percentile(values: list[float], q: float) -> float | None:
    """Nearest-rank percentile (q in [0, 100]) of `values`; None when empty."""
    if not values:
        return None
    s = sorted(values)
    k = max(0, min(len(s) - 1, int(-(-q * len(s) // 100)) - 1))
    return s[k]


def fleet(ledgers: Iterable[Ledger], since: float | None = None) -> dict[str, Any]:
    """Fleet figures over the runs active since `since`: ETTR (productive / wall of the runs
    whose goodput is known), badput by cause, incidents and mean time to failure by cause
    (run hours per incident), time to recover p50/p95 (first sign -> first progress after
    the restart), incidents per 1,000 node-hours."""
    runs = unknown = 0
    wall = productive = node_s = run_s = 0.0
    badput = dict.fromkeys(PARTS, 0.0)
    by_cause: dict[str, int] = {}
    ttr: list[float] = []
    for led in ledgers:
        if not led.attempts or (since is not None and (led.last_ts or 0.0) < since):
            continue
        runs += 1
        acc = account(led)
        run_s += acc.wall_s
        node_s += acc.node_s
        if acc.ratio is None:
            unknown += 1
        else:
            wall += acc.wall_s
            productive += acc.productive_s
            for k, v in acc.badput.items():
                badput[k] += v
        for i in led.incidents:
            by_cause[i.cause] = by_cause.get(i.cause, 0) + 1
            if i.recovered_ts is not None:
                ttr.append(max(0.0, i.recovered_ts - i.first_sign_ts))
    incidents = sum(by_cause.values())
    return {
        "runs": runs, "runs_unknown": unknown, "wall_s": round(wall, 3),
        "productive_s": round(productive, 3),
        "ettr": round(productive / wall, 5) if wall > 0 else None,
        "badput_s": {k: round(v, 3) for k, v in badput.items()},
        "incidents": incidents, "incidents_by_cause": dict(sorted(by_cause.items())),
        "mttf_s": {c: round(run_s / n, 3) for c, n in sorted(by_cause.items())},
        "mttf_all_s": round(run_s / incidents, 3) if incidents else None,
        "ttr_p50_s": percentile(ttr, 50), "ttr_p95_s": percentile(ttr, 95),
        "node_hours": round(node_s / 3600, 3),
        "incidents_per_1000_node_hours":
            round(1000 * incidents / (node_s / 3600), 3) if node_s > 0 else None,
    }
