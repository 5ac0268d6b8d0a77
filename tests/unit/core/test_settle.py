"""Settling a failure in event time: a lagging partition must not make a cascade the root."""

from __future__ import annotations

from faultwatch.core.events import Exit, Heartbeat, Hit, Match, RunStart
from faultwatch.core.job import DECIDED, SETTLING, JobState, apply, tick
from faultwatch.core.policy import Policy

P = Policy(settle_s=2, node_lost_s=30, hang_window_s=600)


def hit(rule: str, cat: str, ts: float, rank: int, node: str, cascade: bool = False) -> Hit:
    return Hit("j", 0, node, Match(rule=rule, category=cat, cascade=cascade, ts=ts,
                                   line=f"{rule} on rank {rank}", rank=rank, seq=int(ts)))


def started(nodes: tuple[str, ...] = ("A", "B"), nnodes: int | None = None) -> JobState:
    st = JobState(job="j")
    for n in nodes:
        st, _ = apply(st, RunStart("j", 0, n, ts=90.0, nnodes=nnodes), 90.0, P)
        st, _ = apply(st, Heartbeat("j", 0, n, 95.0, True, 95.0), 95.0, P)
    return st


def test_lagging_partition_root_line_still_wins() -> None:
    """Node A's root error (100.0) sits behind A's lagging logs partition; node B's cascade
    and exit arrive first. 5 s of processor time later A's root line arrives, then A's first
    heartbeat after the failure: the root must be A's line, not B's cascade."""
    st = started()
    now = 1000.0  # processor time, far ahead of agent time: the processor is lagging
    st, decs = apply(st, hit("gloo-peer-closed", "retryable", 100.5, 8, "B", cascade=True),
                        now, P)
    st, decs = apply(st, Exit("j", 0, "B", 101.2, exit_code=1), now, P)
    assert decs == [] and st.phase == SETTLING
    for dt in (0.5, 1.0, 2.5, 4.0, 5.0):  # the old processor-time settle fired at +2 s
        st, decs = tick(st, now + dt, P, caught_up=True)
        assert decs == [], dt
    st, decs = apply(st, hit("python-import-error", "fatal", 100.0, 3, "A"), now + 5.0, P)
    assert decs == []
    # A's heartbeat stamped 1 s after B's exit: not yet settle_s past the failure
    st, decs = apply(st, Heartbeat("j", 0, "A", 102.2, True, 100.0), now + 5.1, P)
    assert decs == []
    st, decs = apply(st, Heartbeat("j", 0, "A", 104.2, True, 100.0), now + 5.2, P)
    assert len(decs) == 1 and st.phase == DECIDED
    d = decs[0]
    assert (d.kind, d.action, d.rule, d.ranks) == ("error", "fail", "python-import-error", (3,))
    assert d.evidence["first_error"]["node"] == "A"
    assert d.evidence["settle"]["basis"] == "heartbeats"


def test_all_nodes_exited_decides_at_once() -> None:
    st = started()
    st, _ = apply(st, hit("python-network-error", "retryable", 100.0, 1, "A"), 500.0, P)
    st, decs = apply(st, Exit("j", 0, "A", 101.0, 1), 500.0, P)
    assert decs == []
    st, decs = apply(st, Exit("j", 0, "B", 101.3, 1), 500.1, P)  # 0.3 s < settle_s
    assert [(d.action, d.rule) for d in decs] == [("restart", "python-network-error")]
    assert decs[0].evidence["settle"]["basis"] == "all-exited"


def test_expected_node_not_seen_blocks_until_fallback() -> None:
    """nnodes=3 but only A and B started (C's records may be behind): both exiting is not
    enough, heartbeats are not enough; the caught-up fallback decides."""
    st = started(nnodes=3)
    st, _ = apply(st, Exit("j", 0, "A", 101.0, 1), 500.0, P)
    st, decs = apply(st, Exit("j", 0, "B", 101.5, 1), 500.0, P)
    assert decs == [] and st.phase == SETTLING
    fallback = 500.0 + P.settle_s + P.node_lost_s
    assert tick(st, fallback - 0.1, P)[1] == []
    assert tick(st, fallback, P, caught_up=False)[1] == []  # lagging: no processor-time verdict
    st2, decs = tick(st, fallback, P, caught_up=True)
    assert decs[0].kind == "exit" and decs[0].evidence["settle"]["basis"] == "timeout"
    # C shows up and exits before that: every expected node exited, decide at once
    st, _ = apply(st, RunStart("j", 0, "C", ts=91.0, nnodes=3), 510.0, P)
    st, decs = apply(st, Exit("j", 0, "C", 102.0, 1), 510.0, P)
    assert decs and decs[0].evidence["settle"]["basis"] == "all-exited"


def test_silent_node_is_waited_for_only_until_the_fallback() -> None:
    st = started()
    st, _ = apply(st, Exit("j", 0, "B", 101.0, 1), 200.0, P)
    # A's heartbeat predates the horizon (failure 101 + settle 2): it proves nothing
    st, decs = apply(st, Heartbeat("j", 0, "A", 102.9, True, 99.0), 201.0, P)
    assert decs == []
    assert tick(st, 231.9, P)[1] == []
    _, decs = tick(st, 232.0, P)
    assert decs and decs[0].evidence["settle"]["basis"] == "timeout"


def test_earlier_failure_seen_later_moves_the_horizon_back() -> None:
    st = started(("A", "B", "C"))
    st, _ = apply(st, Exit("j", 0, "B", 105.0, 1), 300.0, P)
    st, _ = apply(st, Exit("j", 0, "A", 101.0, 1), 301.0, P)
    assert st.failure_ts == 101.0
    _, decs = apply(st, Heartbeat("j", 0, "C", 103.0, True, 99.0), 302.0, P)
    assert decs and decs[0].evidence["settle"]["basis"] == "heartbeats"


def test_state_written_before_event_time_settling_still_decides() -> None:
    st = started()
    st, _ = apply(st, Exit("j", 0, "B", 101.0, 1), 200.0, P)
    d = st.to_dict()
    del d["failure_ts"]  # a table record from the previous processor version
    old = JobState.from_dict(d)
    assert old.failure_ts is None
    assert tick(old, 201.0, P)[1] == []
    assert tick(old, 202.0, P)[1][0].evidence["settle"]["basis"] == "processor-time"
