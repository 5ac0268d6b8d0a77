"""Events fed to the pure job state machine in unit tests (time passed in, as the core takes it).

Each helper applies one event at `ts` under a policy (AD: an adaptive hang window 10..600 s,
no settle, no diagnosis) and returns the new state (and the decisions, where there can be some).
"""

from __future__ import annotations

from faultwatch.core.events import (
    Heartbeat,
    Hit,
    Match,
    Output,
    Progress,
    RunStart,
    Signal,
    TailLine,
)
from faultwatch.core.job import JobState, apply, new_state
from faultwatch.core.policy import Policy

AD = Policy(hang_floor_s=10, hang_ceiling_s=600, settle_s=0, max_restarts=10, diagnose=False,
            hang_needs_evidence=False)  # the learned window itself (evidence: test_hang_evidence)


def start(nodes: tuple[str, ...] = ("n0",), attempt: int = 0, ts: float = 100.0,
          st: JobState | None = None, world: int | None = None, nnodes: int | None = None,
          policy: Policy = AD) -> JobState:
    st = st or JobState(job="j")
    for n in nodes:
        st, _ = apply(st, RunStart("j", attempt, n, ts=ts, world_size=world, nnodes=nnodes),
                         ts, policy)
    return st


def out(st: JobState, ts: float, node: str = "n0", rank: int = 0, attempt: int = 0,
        text: str = "x", policy: Policy = AD) -> JobState:
    st, decs = apply(st, Output("j", attempt, node, ts, 1, ((rank, ts),),
                               (TailLine(rank, ts, text),)), ts, policy)
    assert decs == []
    return st


def hb(st: JobState, ts: float, last: float | None, node: str = "n0", attempt: int = 0,
       policy: Policy = AD) -> tuple[JobState, list]:
    """A heartbeat; the `diagnose` requests it may raise (no agent answers here) are left
    out (tests/unit/core/test_diagnosis.py covers them)."""
    st, decs = apply(st, Heartbeat("j", attempt, node, ts, True, last), ts, policy)
    return st, [d for d in decs if d.kind != "diagnose"]


def prog(st: JobState, ts: float, step: int, rank: int = 0, node: str = "n0",
         step_time: float | None = None, attempt: int = 0, policy: Policy = AD
         ) -> tuple[JobState, list]:
    return apply(st, Progress("j", attempt, node, ts, rank, step, step_time_s=step_time,
                             source="sdk" if step_time is not None else "log"), ts, policy)


def training(st: JobState, t0: float, t1: float, every: float = 2.0,
             policy: Policy = AD) -> tuple[JobState, float]:
    """Output and one progress step every `every` seconds from t0 to t1."""
    t, step = t0, 0
    while t <= t1:
        st = out(st, t, text=f"step {step}", policy=policy)
        st, _ = prog(st, t, step, policy=policy)
        t, step = t + every, step + 1
    return st, t - every


def slow_run(st: JobState, attempt: int, t0: float) -> tuple[JobState, list]:
    decs: list = []
    for i in range(60):
        t = t0 + i
        for rank in range(4):
            st, d = prog(st, t, i, rank=rank, node=f"n{rank}", attempt=attempt,
                         step_time=2.0 if rank == 3 else 1.0)
            decs.extend(d)
    return st, decs


def hit(rule: str, cat: str, ts: float, node: str = "n0", attempt: int = 0,
        line: str = "") -> Hit:
    return Hit("j", attempt, node, Match(rule=rule, category=cat, cascade=False, ts=ts,
                                         line=line or f"{rule} line", rank=0))


def feed(st: JobState | None, *sigs: Signal, policy: Policy = AD, now: float | None = None,
         answers: dict[str, frozenset[str]] | None = None) -> tuple[JobState | None, list]:
    """What a shell does: a job without state starts one only on a run-start; each signal at
    `now` (default its own time), with the scheduler's `answers` (core/membership.py)."""
    decs: list = []
    for s in sigs:
        if st is None:
            st = new_state(s)
            if st is None:
                continue
        st, d = apply(st, s, now if now is not None else getattr(s, "ts", 0.0), policy,
                      answers=answers or {})
        decs += d
    return st, decs
