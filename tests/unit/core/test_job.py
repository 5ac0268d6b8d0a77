"""Unit tests of the per-job state machine (pure: time passed in, no Kafka)."""

from __future__ import annotations

from faultwatch.core.events import Exit, Heartbeat, Hit, Match, Output, RunStart, TailLine
from faultwatch.core.job import DECIDED, DONE, SETTLING, JobState, apply, decision_id, tick
from faultwatch.core.policy import Policy

P = Policy(hang_window_s=5, settle_s=2, max_restarts=2, diagnose=False)


def hit(rule: str, cat: str, ts: float, rank: int | None, cascade: bool = False,
        node: str = "n0", attempt: int = 0) -> Hit:
    return Hit("j", attempt, node, Match(rule=rule, category=cat, cascade=cascade, ts=ts,
                                         line=f"{rule} line", rank=rank, seq=int(ts)))


def started(attempt: int = 0, nodes: tuple[str, ...] = ("n0",)) -> JobState:
    st = JobState(job="j")
    for n in nodes:
        st, _ = apply(st, RunStart("j", attempt, n, ts=100.0), 100.0, P)
    return st


def test_retryable_root_beats_earlier_cascade_and_waits_for_settle() -> None:
    st = started(nodes=("n0", "n1"))
    st, _ = apply(st, hit("gloo-closed-by-peer", "retryable", 109.0, 0, cascade=True), 110, P)
    st, _ = apply(st, hit("connection-error", "retryable", 110.0, 1), 110, P)
    st, decs = apply(st, Exit("j", 0, "n0", 111.0, exit_code=1), now=111.0, policy=P)
    assert decs == [] and st.phase == SETTLING  # n1 still runs: its errors may be on the way
    st, decs = tick(st, 112.0, P)
    assert decs == []  # still settling
    st, decs = apply(st, Heartbeat("j", 0, "n1", ts=112.5, alive=True, last_output_ts=105.0),
                        112.5, P)
    assert decs == []  # n1's heartbeat is not yet settle_s past the failure (agent time)
    st, decs = apply(st, Heartbeat("j", 0, "n1", ts=113.1, alive=True, last_output_ts=105.0),
                        113.1, P)
    assert len(decs) == 1
    assert decs[0].evidence["settle"]["basis"] == "heartbeats"
    d = decs[0]
    assert (d.action, d.kind, d.rule, d.ranks) == ("restart", "error", "connection-error", (1,))
    assert d.evidence["first_error"]["rank"] == 1
    assert st.phase == DECIDED and st.restarts_used == 1
    st, again = tick(st, 200.0, P)
    assert again == []


def test_fatal_error_fails_without_restart() -> None:
    st = started()
    st, _ = apply(st, hit("python-module-not-found", "fatal", 101, 1), 101, P)
    # the only node exited: every line is in, no need to wait settle_s
    st, decs = apply(st, Exit("j", 0, "n0", 102, exit_code=1), 102, P)
    assert [d.action for d in decs] == ["fail"] and st.restarts_used == 0
    assert decs[0].evidence["settle"]["basis"] == "all-exited"


def test_unknown_failure_fails_under_default_policy_and_restarts_on_failure() -> None:
    st = started()
    _, decs = apply(st, Exit("j", 0, "n0", 102, exit_code=3), 102, P)
    assert decs[0].action == "fail" and decs[0].kind == "exit"
    p2 = Policy(settle_s=0, fault_tolerant_policy="on_failure")
    st = started()
    _, decs = apply(st, Exit("j", 0, "n0", 102, exit_code=3), 102, p2)
    assert decs[0].action == "restart"


def test_hang_in_event_time_from_heartbeats_names_quiet_rank() -> None:
    st = started()
    st, _ = apply(st, Output("j", 0, "n0", 101, 2, rank_last_ts=((0, 103.0), (1, 101.0)),
                            tail=(TailLine(1, 101, "rank 1 stuck"),)), 101, P)
    st, decs = apply(st, Heartbeat("j", 0, "n0", ts=107.0, alive=True, last_output_ts=103.0),
                        500.0, P)
    assert decs == []  # silent 4 s < 5 s window, whatever the processor clock says
    st, decs = apply(st, Heartbeat("j", 0, "n0", ts=108.5, alive=True, last_output_ts=103.0),
                        500.0, P)
    assert len(decs) == 1
    d = decs[0]
    assert (d.action, d.kind, d.ranks) == ("restart", "hang", (1,))
    assert d.evidence["window_s"] == 5 and d.evidence["last_lines"]["1"] == ["rank 1 stuck"]


def test_hang_needs_every_node_silent() -> None:
    st = started(nodes=("a", "b"))
    st, _ = apply(st, Heartbeat("j", 0, "a", ts=120, alive=True, last_output_ts=101), 0, P)
    st, decs = apply(st, Heartbeat("j", 0, "b", ts=120, alive=True, last_output_ts=119), 0, P)
    assert decs == []
    st, decs = apply(st, Heartbeat("j", 0, "b", ts=125, alive=True, last_output_ts=119), 0, P)
    assert [d.kind for d in decs] == ["hang"]


def test_budget_exhausted_fails_and_attempts_reset_state() -> None:
    st = started()
    for attempt in range(3):
        st, _ = apply(st, RunStart("j", attempt, "n0", ts=100.0 + attempt), 0, P)
        st, _ = apply(st, hit("connection-error", "retryable", 101 + attempt, 1,
                             attempt=attempt), 0, P)
        st, decs = apply(st, Exit("j", attempt, "n0", 102 + attempt, exit_code=1), 0, P)
        assert len(decs) == 1
        expected = "restart" if attempt < 2 else "fail"
        assert decs[0].action == expected, (attempt, decs[0].message)
    assert "budget exhausted" in decs[0].message


def test_late_records_of_old_attempt_are_ignored() -> None:
    st = started(attempt=1)
    st2, decs = apply(st, Exit("j", 0, "n0", 102, exit_code=1), 102, P)
    assert st2 is st and decs == []


def test_clean_exit_is_done_without_decision() -> None:
    st = started(nodes=("a", "b"))
    st, d1 = apply(st, Exit("j", 0, "a", 110, exit_code=0), 110, P)
    st, d2 = apply(st, Exit("j", 0, "b", 111, exit_code=0), 111, P)
    assert d1 == d2 == [] and st.phase == DONE


def test_exit_hang() -> None:
    p = Policy(exit_hang_window_s=10, hang_window_s=1000)
    st = started(nodes=("a", "b"))
    st, _ = apply(st, Exit("j", 0, "a", 110, exit_code=0), 110, p)
    st, decs = apply(st, Heartbeat("j", 0, "b", ts=115, alive=True, last_output_ts=114), 0, p)
    assert decs == []
    st, decs = apply(st, Heartbeat("j", 0, "b", ts=121, alive=True, last_output_ts=120), 0, p)
    assert [(d.kind, d.action) for d in decs] == [("exit-hang", "restart")]


def test_same_error_limit() -> None:
    p = Policy(settle_s=0, max_same_error=1, max_restarts=10)
    st = JobState(job="j")
    actions = []
    for attempt in range(2):
        st, _ = apply(st, RunStart("j", attempt, "n0", ts=100.0), 0, p)
        st, _ = apply(st, hit("nccl-error", "retryable", 101, 0, attempt=attempt), 0, p)
        st, decs = apply(st, Exit("j", attempt, "n0", 102, exit_code=1), 0, p)
        actions.append(decs[0].action)
    assert actions == ["restart", "fail"]


def test_hardware_blacklists_failing_node_and_async_restarts_only_failed() -> None:
    st = started(nodes=("a", "b"))
    st, _ = apply(st, hit("cuda-ecc", "hardware", 101, 3, node="b"), 0, P)
    st, _ = apply(st, Exit("j", 0, "b", 102, exit_code=1), 0, P)
    _, decs = tick(st, 1000, P)
    assert (decs[0].action, decs[0].nodes) == ("blacklist", ("b",))
    pa = Policy(settle_s=0, execution_mode="async")
    st = started(nodes=("a", "b"))
    st, _ = apply(st, hit("conn", "retryable", 101, 3, node="b"), 0, pa)
    st, _ = apply(st, Exit("j", 0, "b", 102, exit_code=1), 0, pa)
    _, decs = tick(st, 1000, pa)
    assert (decs[0].action, decs[0].nodes) == ("restart", ("b",))


def test_failure_rate_in_async_mode() -> None:
    pa = Policy(settle_s=0, execution_mode="async", max_failure_rate=0.4)
    st = started(nodes=("a", "b", "c"))
    for n in ("a", "b"):
        st, _ = apply(st, hit("conn", "retryable", 101, None, node=n), 0, pa)
        st, _ = apply(st, Exit("j", 0, n, 102, exit_code=1), 0, pa)
    _, decs = tick(st, 1000, pa)
    assert decs[0].action == "fail" and "failure rate" in decs[0].message


def test_state_round_trips_through_dict() -> None:
    st = started(nodes=("n0", "n1"))
    st, _ = apply(st, hit("conn", "retryable", 101, 1), 0, P)
    st, _ = apply(st, Output("j", 0, "n0", 101, 1, ((1, 101.0),), (TailLine(1, 101, "x"),)), 0, P)
    st, _ = apply(st, Exit("j", 0, "n0", 102, exit_code=1), 50, P)
    assert st.phase == SETTLING and st.failure_ts == 102 and st.failure_seen_at == 50
    again = JobState.from_dict(st.to_dict())
    assert again == st
    assert tick(again, 1000, P)[1][0].id == tick(st, 1000, P)[1][0].id


def test_decision_ids_are_deterministic() -> None:
    assert decision_id("j", 1, "hang", "hang") == decision_id("j", 1, "hang", "hang")
    assert decision_id("j", 1, "hang", "hang") != decision_id("j", 2, "hang", "hang")


def test_silence_before_first_output_uses_init_window() -> None:
    p = Policy(hang_window_s=5, init_window_s=30, diagnose=False)
    st = started()
    st, decs = apply(st, Heartbeat("j", 0, "n0", ts=120.0, alive=True, last_output_ts=None), 0, p)
    assert decs == []  # 20 s without any output is start-up, not a hang
    st, decs = apply(st, Heartbeat("j", 0, "n0", ts=131.0, alive=True, last_output_ts=None), 0, p)
    assert [d.kind for d in decs] == ["hang"]
    assert Policy(hang_window_s=5).effective_init_window_s == 120.0


def test_a_decision_stays_small_whatever_the_lines_it_quotes() -> None:
    """Evidence quotes at most MAX_EVIDENCE_LINE characters of a line: a 64 KiB line and
    traceback cannot push a decision past the broker's record limit."""
    from faultwatch.wire import encode_decision

    big = "E" * 65536
    st = started()
    for i in range(20):
        m = Match(rule="r", category="fatal", cascade=False, ts=101 + i, line=big, rank=0,
                  seq=i, context=tuple(big for _ in range(60)))
        st, _ = apply(st, Hit("j", 0, "n0", m), 101 + i, P)
    st, decs = apply(st, Exit("j", 0, "n0", 130, exit_code=1), 130, P)
    assert [d.action for d in decs] == ["fail"]
    assert len(encode_decision(decs[0])) < 200_000
    assert decs[0].evidence["first_error"]["line"].startswith("EEEE")


def test_an_operators_stop_is_a_stop_not_a_failure() -> None:
    for sig, code in ((15, 143), (9, 137)):  # SIGTERM, or SIGKILL after the grace period
        st = started()
        st, decs = apply(st, Exit("j", 0, "n0", 102, exit_code=code, signal=sig,
                                  stopped=True), 102, P)
        assert decs == [] and st.phase == DONE
        st, decs = tick(st, 500.0, P)
        assert decs == []
    # positive control: the same exit without the stop fails the job
    _, decs = apply(started(), Exit("j", 0, "n0", 102, exit_code=137, signal=9), 102, P)
    assert [d.action for d in decs] == ["fail"]
