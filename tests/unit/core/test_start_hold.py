"""The start of an attempt (core/start.py): a node whose launcher is still assembling a
multi-node job is not decided hung before the launcher's own rendezvous deadline (+ margin),
until one of its ranks prints; edges at a quarter second, time passed in."""

from __future__ import annotations

import pytest

from faultwatch.core.events import Heartbeat, Output, RunStart, TailLine
from faultwatch.core.job import JobState, apply
from faultwatch.core.policy import Policy
from faultwatch.core.start import MAX_START_HOLD_S, START_MARGIN_S, start_hold_s

P = Policy(init_window_s=20, hang_ceiling_s=20, hang_floor_s=5, settle_s=0, diagnose=False)
C10D = ["torchrun", "--nnodes", "2", "--rdzv-backend", "c10d", "--rdzv-endpoint", "h:1",
        "--rdzv-conf", "join_timeout=90", "train.py"]
HOLD = 90 + START_MARGIN_S  # from the start at 100 s


def started(cmd: list[str], node: str = "a", ts: float = 100.0,
            st: JobState | None = None) -> JobState:
    st, _ = apply(st or JobState(job="j"), RunStart("j", 0, node, ts=ts, cmd=tuple(cmd)),
                  ts, P)
    return st


def hang_at(st: JobState, ts: float, last: float | None, node: str = "a") -> bool:
    st, decs = apply(st, Heartbeat("j", 0, node, ts, True, last), ts, P)
    return any(d.kind == "hang" for d in decs)


def output(st: JobState, ts: float, rank: int | None, node: str = "a") -> JobState:
    st, decs = apply(st, Output("j", 0, node, ts, 1, ((rank, ts),),
                                (TailLine(rank if rank is not None else -1, ts, "x"),)), ts, P)
    assert decs == []
    return st


@pytest.mark.parametrize("d", [-0.25, 0.0], ids=["below", "at"])
def test_a_silent_start_is_held_to_the_launchers_deadline(d: float) -> None:
    st = started(C10D)
    assert not hang_at(st, 100.0 + 20 + 5, None)  # past the init window: held
    assert hang_at(st, 100.0 + HOLD + d, None) == (d >= 0)


def test_the_launchers_banner_does_not_end_the_hold_a_rank_line_does() -> None:
    st = output(started(C10D), 101.0, None)  # torchrun's own OMP_NUM_THREADS warning
    assert not hang_at(st, 101.0 + 60, 101.0)  # well past the 20 s window: still held
    assert hang_at(st, 100.0 + HOLD, 101.0)
    ranked = output(started(C10D), 101.0, 0)  # a rank printed: the job is assembled
    assert hang_at(ranked, 101.0 + 20, 101.0)  # the ordinary window again


def test_what_is_not_held() -> None:
    for cmd in (["torchrun", "--standalone", "--nproc-per-node", "2", "t.py"],  # one node
                ["python", "train.py"],  # no launcher deadline
                ["torchrun", "--nnodes", "2", "--rdzv-backend", "c10d",
                 "--rdzv-conf", "join_timeout=$T", "t.py"],  # unreadable: not held
                []):
        assert hang_at(started(cmd), 100.0 + 20, None), cmd


def test_every_node_of_the_job_is_held_until_its_own_deadline() -> None:
    st = started(C10D, "a", 100.0)
    st = started(C10D, "b", 110.0, st)  # a node 10 s late

    def beats(st: JobState, ts: float) -> tuple[JobState, list[str]]:
        kinds = []
        for node in ("a", "b"):
            st, decs = apply(st, Heartbeat("j", 0, node, ts, True, None), ts, P)
            kinds += [d.kind for d in decs]
        return st, kinds

    st, kinds = beats(st, 100.0 + HOLD)  # a's hold is over, b's is not: no hang
    assert "hang" not in kinds
    st, kinds = beats(st, 110.0 + HOLD)
    assert "hang" in kinds


def test_the_hold_and_its_evidence() -> None:
    assert start_hold_s(C10D) == HOLD
    assert start_hold_s(["torchrun", "--nnodes", "4", "t.py"]) == 900 + START_MARGIN_S
    assert start_hold_s(["torchrun", "--nnodes", "2", "--rdzv-backend", "c10d",
                         "--rdzv-conf", "join_timeout=999999999", "t.py"]) == MAX_START_HOLD_S
    st = started(C10D)
    st, decs = apply(st, Heartbeat("j", 0, "a", 100.0 + HOLD, True, None), 100.0 + HOLD, P)
    hang = [d for d in decs if d.kind == "hang"]
    assert hang and hang[0].evidence["start_held_until"] == {"a": 100.0 + HOLD}
