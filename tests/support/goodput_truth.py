"""The true goodput of a test job, from what the job wrote of itself (tests/e2e/jobs/
goodput_*.py: launches read from /proc, steps, checkpoints, evals, faults), the decisions'
times and the commands' exits the test observed: a second, independent reckoning of
docs/goodput.md's definitions, to hold faultwatch's (computed from the logs alone) against.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

PARTS = ("productive", "startup", "checkpoint", "eval", "hang_silence", "detection",
         "restart", "lost_work", "waiting", "other")
WAITING = ("preempt", "node-lost")


@dataclass
class Attempt:
    n: int
    launch: float
    steps: list[tuple[float, int]] = field(default_factory=list)
    ckpts: list[tuple[float, float, int]] = field(default_factory=list)
    evals: list[tuple[float, float]] = field(default_factory=list)
    fault: str | None = None  # crash | hang | preempt | node-lost
    fault_ts: float | None = None


def read_truth(path: Path) -> dict[int, Attempt]:
    """The attempts a truth.jsonl tells of (steps and stages as rank 0 saw them)."""
    rows = [json.loads(x) for x in path.read_text().splitlines() if x.strip()]
    out: dict[int, Attempt] = {}
    open_: dict[str, dict[str, Any]] = {}
    for r in sorted(rows, key=lambda r: r["ts"]):
        a = out.get(r["attempt"])
        if r["ev"] == "launch":
            if a is None:
                out[r["attempt"]] = Attempt(r["attempt"], r["ts"])
            else:
                a.launch = min(a.launch, r["ts"])
            continue
        assert a is not None, r
        ev = r["ev"]
        if ev == "step":
            a.steps.append((r["ts"], r["step"]))
        elif ev in ("ckpt_start", "eval_start"):
            open_[ev[:4]] = r
        elif ev == "ckpt_end":
            a.ckpts.append((open_.pop("ckpt")["ts"], r["ts"], r["step"]))
        elif ev == "eval_end":
            a.evals.append((open_.pop("eval")["ts"], r["ts"]))
        elif ev in ("crash", "hang", "preempt"):
            a.fault, a.fault_ts = ev, r["ts"]
    return out


def _overlap(spans: Iterable[tuple[float, float]], lo: float, hi: float) -> float:
    return sum(max(0.0, min(e, hi) - max(s, lo)) for s, e in spans)


def true_parts(attempts: Mapping[int, Attempt], decided: Mapping[int, float],
               end: float) -> dict[str, Any]:
    """Seconds of each part (docs/goodput.md), lost steps per failed attempt, wall time.
    `decided`: attempt -> its restart decision's time; `end`: the last command's exit."""
    p = dict.fromkeys(PARTS, 0.0)
    lost_steps: dict[int, int] = {}
    order = sorted(attempts)
    last_ckpt: tuple[float, int] | None = None
    for k, n in enumerate(order):
        a = attempts[n]
        hi = attempts[order[k + 1]].launch if k + 1 < len(order) else end
        first = a.steps[0][0] if a.steps else hi
        if a.fault_ts is not None and first > a.fault_ts:
            first = a.fault_ts
        p["startup" if k == 0 else "restart"] += first - a.launch
        if a.fault is None:  # ran to its end: training up to the last step, then teardown
            stop = a.steps[-1][0] if a.steps else first
        elif a.fault == "hang":  # the silence starts at the last line
            stop = max(a.fault_ts or 0.0, a.steps[-1][0] if a.steps else first)
        else:
            assert a.fault_ts is not None
            stop = a.fault_ts
        spans = [(s, e) for s, e, _ in a.ckpts]
        ck = _overlap(spans, first, stop)
        ev = _overlap(a.evals, first, stop)
        lost = 0.0
        ckpts_before = [(e, st) for _s, e, st in a.ckpts if e <= stop]
        if ckpts_before:
            last_ckpt = max(ckpts_before)
        if a.fault is not None and last_ckpt is not None:
            lo = max(last_ckpt[0], first)
            lost = max(0.0, stop - lo) - _overlap(spans + a.evals, lo, stop)
            # every step done since the checkpoint is done again (a lost node's other
            # ranks go on past the first sign until the restart)
            top = max((s for _t, s in a.steps), default=last_ckpt[1])
            lost_steps[n] = top - last_ckpt[1]
        p["checkpoint"] += ck
        p["eval"] += ev
        p["lost_work"] += lost
        p["productive"] += (stop - first) - ck - ev - lost
        if a.fault is None:
            tail = _overlap(spans, stop, hi) + _overlap(a.evals, stop, hi)
            p["checkpoint"] += _overlap(spans, stop, hi)
            p["eval"] += _overlap(a.evals, stop, hi)
            p["other"] += (hi - stop) - tail
        else:
            d = decided[n]
            p["hang_silence" if a.fault == "hang" else "detection"] += d - stop
            p["waiting" if a.fault in WAITING else "restart"] += hi - d
    wall = end - attempts[order[0]].launch
    return {"parts": p, "wall_s": wall, "lost_steps": lost_steps}


def compare(computed: Mapping[str, float], truth: Mapping[str, float]) -> list[str]:
    """The parts off by more than 2 s or 2 % of the true part, whichever is larger."""
    bad = []
    for k in PARTS:
        c, t = computed.get(k, 0.0), truth.get(k, 0.0)
        if abs(c - t) > max(2.0, 0.02 * t):
            bad.append(f"{k}: computed {c:.2f} s, true {t:.2f} s")
    return bad


def computed_parts(account: Mapping[str, Any]) -> dict[str, float]:
    """A report's account (`faultwatch report --json`) as parts."""
    return {"productive": account["productive_s"], **account["badput_s"]}


class ExitWatch:
    """Records when each launched command (the torchrun pids the job's truth names) exits,
    polling /proc every 20 ms: the end of an attempt as the test sees it."""

    def __init__(self, truth: Path) -> None:
        self.truth = truth
        self.exits: dict[int, float] = {}
        self._stop = threading.Event()
        self._t = threading.Thread(target=self._run, daemon=True)
        self._t.start()

    def _pids(self) -> set[int]:
        try:
            rows = [json.loads(x) for x in self.truth.read_text().splitlines() if x.strip()]
        except (OSError, ValueError):
            return set()
        return {r["torchrun_pid"] for r in rows if r["ev"] == "launch"}

    @staticmethod
    def _alive(pid: int) -> bool:
        try:
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            return False
        return state != "Z"

    def _run(self) -> None:
        while not self._stop.is_set():
            for pid in self._pids() - set(self.exits):
                if not self._alive(pid):
                    self.exits[pid] = time.time()
            self._stop.wait(0.02)

    def stop(self) -> dict[int, float]:
        self._stop.set()
        self._t.join(5)
        return self.exits

