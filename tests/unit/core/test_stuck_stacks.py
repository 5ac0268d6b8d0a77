"""A silent job with nothing learned (window: the ceiling) is probed at growing silences; stacks
unchanged over a hang_floor_s with the culprits idle decide the hang before the window, and
anything that says "maybe progress" (a busy culprit, CPU used, a changed stack, a checkpoint)
leaves the decision to the window."""

from __future__ import annotations

from typing import Any

from faultwatch.core.events import Heartbeat, Notice, RunStart
from faultwatch.core.job import JobState, apply
from faultwatch.core.policy import Policy
from faultwatch.core.silence import probe_offsets
from tests.support.job_events import out

P = Policy(settle_s=0, max_restarts=10)  # adaptive, floor 30 s, ceiling 600 s, diagnose at 0.5
COLL = {"state": "collective", "op": "broadcast", "at": "train.py:53 in <module>",
        "frames": ["distributed_c10d.py:4055 in broadcast"], "idle": True}
SLEEP = {"state": "elsewhere", "op": None, "at": "train.py:45 in on_train_batch_end",
         "frames": ["train.py:45 in on_train_batch_end"], "idle": True}


def test_probes_from_half_the_floor_then_every_floor_up_to_the_windows_own_request() -> None:
    assert probe_offsets(300.0, P) == (15.0, 30.0, 60.0, 90.0, 120.0, 150.0, 180.0, 210.0,
                                       240.0, 270.0)
    assert probe_offsets(20.0, P) == (15.0,)  # a learned 40 s window: its own request at 20 s


def silent(st: JobState | None = None) -> tuple[JobState, float]:
    st, _ = apply(JobState(job="j"), RunStart("j", 0, "n0", 100.0, world_size=2), 100.0, P)
    for t in (101.0, 102.0, 103.0):
        st = out(st, t, policy=P)
    return st, 103.0


def run(rank1: list[dict[str, Any]], cpu1: list[float], until_s: float = 200.0
        ) -> tuple[list[float], Any]:
    """Beat every second; answer each `diagnose` with rank 0 in the collective and rank 1 as
    the next of `rank1`/`cpu1` says. Returns the probe silences and the hang (or None)."""
    st, last = silent()
    asked: list[float] = []
    t = last
    while t < last + until_s:
        t += 1.0
        st, decs = apply(st, Heartbeat("j", 0, "n0", t, True, last), t, P)
        for d in decs:
            if d.kind == "hang":
                return asked, d
            if d.kind == "diagnose":
                k = min(len(asked), len(rank1) - 1)
                asked.append(t - last)
                data = {"request": d.id, "ranks": {
                    "0": {"stack": COLL, "source": "py-spy", "cpu_s": 3.0 + len(asked)},
                    "1": {"stack": rank1[k], "source": "py-spy", "cpu_s": cpu1[k]}}}
                st, more = apply(st, Notice("j", 0, "n0", t + 1, "diagnosis", data), t + 1, P)
                assert not more
    return asked, None


def test_unchanged_idle_stacks_decide_before_the_ceiling_naming_the_culprit() -> None:
    asked, hang = run([SLEEP], [5.0])
    assert asked[:3] == [15.0, 30.0, 60.0]
    assert hang is not None and hang.ranks == (1,)
    assert 60.0 <= hang.ts - 103.0 <= 62.0, hang.ts - 103.0
    assert hang.evidence["window"]["basis"] == "ceiling"
    assert hang.evidence["stacks_unchanged"]["captures_span_s"] >= 30.0
    assert "rank 1 is at train.py:45 in on_train_batch_end" in hang.message


def test_a_culprit_on_cpu_or_using_cpu_is_left_to_the_window() -> None:
    busy = dict(SLEEP, idle=False)
    assert run([busy], [5.0])[1] is None
    assert run([SLEEP, SLEEP, SLEEP], [5.0, 10.0, 40.0])[1] is None  # 30 s of CPU in 30 s


def test_a_changing_stack_restarts_the_span() -> None:
    moved = [dict(SLEEP, at=f"train.py:{40 + i} in step", frames=[f"train.py:{40 + i}"])
             for i in range(20)]
    asked, hang = run(moved, [5.0] * 20)
    assert hang is None and len(asked) >= 4


def test_a_checkpoint_writer_is_never_decided_early() -> None:
    save = {"state": "checkpoint", "op": "_save", "at": "train.py:60 in save",
            "frames": ["serialization.py:650 in _save"], "idle": True}
    assert run([save], [5.0])[1] is None


def test_a_stall_after_a_long_checkpoint_write_is_decided_two_floors_after_it() -> None:
    save = {"state": "checkpoint", "op": "_save", "at": "train.py:60 in save",
            "frames": ["serialization.py:650 in _save"], "idle": True}
    asked, hang = run([save] * 4 + [SLEEP], [5.0] * 5, until_s=400.0)
    assert asked[:5] == [15.0, 30.0, 60.0, 90.0, 120.0]  # probes go on through the write
    assert hang is not None and hang.ranks == (1,)
    assert 150.0 <= hang.ts - 103.0 <= 152.0, hang.ts - 103.0
