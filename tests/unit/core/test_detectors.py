"""Unit tests of every detector of the pure core (time passed in, no Kafka)."""

from __future__ import annotations

from faultwatch.core.events import (
    Exit,
    Heartbeat,
    Hit,
    Match,
    Notice,
    Output,
    RunStart,
    Stage,
)
from faultwatch.core.job import DECIDED, RUNNING, SETTLING, JobState, apply, tick
from faultwatch.core.policy import Policy
from faultwatch.core.windows import GapHist
from tests.support.job_events import AD, hb, hit, out, prog, slow_run, start, training

# ---- windows ----------------------------------------------------------------------------

def test_gap_histogram_quantiles_and_learned_window() -> None:
    h = GapHist()
    for _ in range(50):
        h = h.add(2.0)
    p99 = h.quantile(0.99)
    assert p99 is not None and 2.0 <= p99 < 2.4
    assert h.learned(AD) == 12.0 or 10.0 <= (h.learned(AD) or 0) <= 12.0
    assert GapHist().add(1.0).learned(AD) is None  # too few samples
    assert GapHist.from_list(h.to_list()) == h


def test_adaptive_hang_window_learned_from_cadence() -> None:
    st = start()
    st, last = training(st, 101.0, 161.0)  # a line and a step every 2 s for a minute
    st, decs = hb(st, last + 9.0, last)
    assert decs == []
    st, decs = hb(st, last + 13.0, last)
    assert [d.kind for d in decs] == ["hang"], decs
    ev = decs[0].evidence
    assert ev["window"]["basis"] == "adaptive" and 10.0 <= ev["window_s"] <= 12.5
    assert ev["window"]["learned"]["samples"] >= 10


def test_adaptive_window_is_the_ceiling_before_warm_up() -> None:
    st = start()
    st = out(st, 101.0)
    st, decs = hb(st, 400.0, 101.0)
    assert decs == []  # nothing learned yet: the ceiling (600 s) applies
    st, decs = hb(st, 702.0, 101.0)
    assert decs and decs[0].evidence["window"]["basis"] == "ceiling"


def test_explicit_hang_window_is_fixed() -> None:
    p = Policy(hang_window_s=100, hang_floor_s=10, settle_s=0)
    st = start(policy=p)
    st, last = training(st, 101.0, 161.0, policy=p)
    st, decs = hb(st, last + 50, last, policy=p)
    assert decs == []  # adaptive would have fired; the user's fixed window wins
    st, decs = hb(st, last + 101, last, policy=p)
    assert decs and decs[0].evidence["window"]["basis"] == "fixed"


def test_checkpoint_stage_longer_than_normal_window_is_no_hang() -> None:
    st = start()
    st, last = training(st, 101.0, 161.0)
    st, _ = apply(st, Stage("j", 0, "n0", last, 0, "checkpoint", True, 300.0), last, AD)
    st, decs = hb(st, last + 200, last)
    assert decs == []
    st, _ = apply(st, Stage("j", 0, "n0", last + 250, 0, "checkpoint", False), last, AD)
    st = out(st, last + 250)
    st, decs = hb(st, last + 255, last + 250)
    assert decs == []
    st, decs = hb(st, last + 263, last + 250)
    assert [d.kind for d in decs] == ["hang"]


def test_stage_without_window_turns_hang_detection_off_and_sdk_window_applies() -> None:
    st = start()
    st, last = training(st, 101.0, 161.0)
    st, _ = apply(st, Stage("j", 0, "n0", last, None, "eval", True, None, "sdk"), last, AD)
    st, decs = hb(st, last + 5000, last)
    assert decs == []
    st2 = start()
    st2, last = training(st2, 101.0, 161.0)
    st2, _ = apply(st2, Stage("j", 0, "n0", last, 0, "init", True, 40.0, "sdk"), last, AD)
    st2, decs = hb(st2, last + 30, last)
    assert decs == []  # declared 40 s, longer than the learned ~12 s
    st2, decs = hb(st2, last + 41, last)
    assert decs and decs[0].evidence["window"] == {"basis": "stage", "stage": "init",
                                                   "declared_s": 40.0, "since": last}


# ---- progress stall, node lost --------------------------------------------------------

def test_progress_stall_when_output_flows_but_step_does_not_advance() -> None:
    st = start()
    st, last = training(st, 101.0, 161.0)
    t = last
    decs: list = []
    while not decs and t < last + 60:
        t += 1.0
        st = out(st, t, text="NCCL WARN retrying")
        st, _ = prog(st, t, 30)  # the same step over and over
        st, decs = hb(st, t + 0.5, t)
    assert [(d.kind, d.action) for d in decs] == [("progress-stall", "restart")]
    assert 10.0 <= decs[0].evidence["stalled_for_s"] <= 14.0
    assert st.phase == DECIDED


def test_silent_job_is_a_hang_not_a_stall() -> None:
    st = start()
    st, last = training(st, 101.0, 161.0)
    st, decs = hb(st, last + 20, last)
    assert [d.kind for d in decs] == ["hang"]


def test_node_lost_only_on_a_trusted_clock_and_it_inhibits_hang() -> None:
    p = Policy(hang_window_s=5, node_lost_s=30, settle_s=0)
    st = start(("a", "b"), policy=p)
    st, _ = hb(st, 101.0, 100.5, node="a", policy=p)
    st, _ = hb(st, 101.0, 100.5, node="b", policy=p)
    # b goes away; a keeps heartbeating, silent: the lagging node inhibits the hang
    for t in range(102, 130):
        st, decs = hb(st, float(t), 100.5, node="a", policy=p)
        assert decs == [], (t, decs)
    st2, decs = tick(st, 135.0, p)
    assert decs == []  # clock not trusted (lagging or in grace): nothing
    st2, decs = tick(st, 135.0, p, live_clock=True)
    assert [(d.kind, d.action) for d in decs] == [("node-lost", "restart")]
    assert decs[0].evidence["lost_nodes"].keys() == {"b"}
    assert decs[0].evidence["blacklist_candidates"] == ["b"]
    assert tick(st2, 136.0, p, live_clock=True)[1] == []


def test_exit_hang_with_two_nodes() -> None:
    p = Policy(exit_hang_window_s=10, hang_window_s=1000)
    st = start(("a", "b"), policy=p)
    st, _ = apply(st, Exit("j", 0, "a", 110, 0), 110, p)
    st, decs = hb(st, 119, 118, node="b", policy=p)
    assert decs == []
    st, decs = hb(st, 121, 120, node="b", policy=p)
    assert [(d.kind, d.action) for d in decs] == [("exit-hang", "restart")]
    assert decs[0].evidence["still_running"] == ["b"]


# ---- slow ranks, skew, notes -------------------------------------------------------------


def test_slow_rank_notifies_once_and_repeats_make_a_blacklist_candidate() -> None:
    st = start(("n0", "n1", "n2", "n3"))
    st, decs = slow_run(st, 0, 101.0)
    assert [(d.kind, d.action, d.ranks) for d in decs] == [("slow", "notify", (3,))]
    assert decs[0].nodes == ("n3",) and decs[0].evidence["median_s"] == 1.0
    assert st.phase == RUNNING  # a notify changes nothing
    st = start(("n0", "n1", "n2", "n3"), attempt=1, ts=300.0, st=st)
    st, decs = slow_run(st, 1, 301.0)
    assert decs[0].evidence["blacklist_candidate"] is True
    pf = Policy(settle_s=0, fault_tolerant_policy="on_failure")
    st, _ = apply(st, Exit("j", 1, "n0", 400.0, 1), 400.0, pf)
    st, decs = tick(st, 400.0 + pf.node_lost_s, pf)  # the others went silent: fallback
    assert decs[0].action == "restart" and "n3" in decs[0].evidence["blacklist_candidates"]


def test_start_skew_notify() -> None:
    p = Policy(skew_warn_s=60)
    st = start(("a",), policy=p)
    st, decs = apply(st, RunStart("j", 0, "b", ts=500.0), 500.0, p)
    assert [(d.kind, d.action, d.nodes) for d in decs] == [("skew", "notify", ("b",))]
    assert decs[0].evidence["spread_s"] == 400.0


def test_missing_nodes_notify_and_never_printed_ranks() -> None:
    p = Policy(skew_warn_s=60, hang_window_s=5, diagnose=False)
    st = start(("a",), world=4, nnodes=2, policy=p)
    st, _ = apply(st, Output("j", 0, "a", 101, 2, ((0, 101.0), (1, 101.0))), 101, p)
    st, decs = hb(st, 103.0, 101.0, node="a", policy=p)
    assert decs == []
    st, decs = hb(st, 106.5, 101.0, node="a", policy=p)
    assert decs[0].kind == "hang"
    assert decs[0].evidence["expected"]["ranks_never_printed"] == [2, 3]
    assert decs[0].evidence["likely_culprit_rank"] == 2
    st = start(("a",), world=4, nnodes=2, policy=Policy(skew_warn_s=60, hang_detection=False))
    st, decs = hb(st, 170.0, None, node="a", policy=Policy(skew_warn_s=60, hang_detection=False))
    assert [(d.kind, d.action) for d in decs] == [("skew", "notify")]


def test_custom_gap_and_bootcheck_notes_notify() -> None:
    st = start()
    st, d1 = apply(st, Notice("j", 0, "n0", 101.0, "notify",
                             {"message": "loss is NaN", "level": "warning"}), 101.0, AD)
    st, d2 = apply(st, Notice("j", 0, "n0", 102.0, "gap", {"dropped_lines": 12}), 102.0, AD)
    st, d3 = apply(st, Notice("j", 0, "n0", 103.0, "bootcheck", {
        "ok": False, "checks": [{"name": "gpu_count", "ok": False, "value": 7,
                                 "detail": "expected 8"}]}), 103.0, AD)
    assert [(d.kind, d.action) for d in d1 + d2 + d3] == [
        ("custom", "notify"), ("gap", "notify"), ("bootcheck", "notify")]
    assert d1[0].message == "loss is NaN" and "12" in d2[0].message
    again, dup = apply(st, Notice("j", 0, "n0", 101.0, "notify",
                                 {"message": "loss is NaN", "level": "warning"}), 101.0, AD)
    assert dup == []  # the same note replayed: same id, deduped
    assert st.phase == RUNNING and "n0" in st.blacklist_candidates(AD)


# ---- failures: retryable notes, hardware, suspects, storm ----------------------------


def test_retryable_errors_note_makes_a_failure_retryable() -> None:
    p = Policy(settle_s=0)
    st = start(policy=p)
    st, _ = apply(st, Notice("j", 0, "n0", 100.5, "retryable_errors",
                            {"patterns": ["StoreTimeout"]}), 100.5, p)
    st = out(st, 101.0, text="RuntimeError: StoreTimeout waiting for rank 3", policy=p)
    st, decs = apply(st, Exit("j", 0, "n0", 102.0, 1), 102.0, p)
    assert (decs[0].action, decs[0].category) == ("restart", "retryable")
    assert decs[0].evidence["retryable_pattern"] == "StoreTimeout"
    # and a policy-level pattern works the same; without any, unknown failures fail
    st = start(policy=p)
    st = out(st, 101.0, text="RuntimeError: StoreTimeout", policy=p)
    assert apply(st, Exit("j", 0, "n0", 102.0, 1), 102.0, p)[1][0].action == "fail"
    p2 = Policy(settle_s=0, retryable_errors=("StoreTimeout",))
    assert apply(st, Exit("j", 0, "n0", 102.0, 1), 102.0, p2)[1][0].action == "restart"


def test_hardware_hit_blacklists_without_exit_and_backs_off() -> None:
    p = Policy(settle_s=1, blacklist_s=100, max_restarts=10)
    st = start(("a", "b"), policy=p)
    st, _ = apply(st, hit("nvidia-xid-79", "hardware", 101.0, node="b"), 101.0, p)
    assert st.phase == SETTLING
    # the process may hang instead of exiting: both nodes' heartbeats settle it
    st, decs = apply(st, Heartbeat("j", 0, "a", 102.0, True, 101.0), 102.0, p)
    assert decs == []
    st, decs = apply(st, Heartbeat("j", 0, "b", 102.1, True, 101.0), 102.5, p)
    d = decs[0]
    assert (d.action, d.nodes) == ("blacklist", ("b",))
    assert d.evidence["blacklist"]["b"]["duration_s"] == 100
    assert d.evidence["restart_nodes"] == ["a", "b"]
    st = start(("a", "b"), attempt=1, ts=200.0, st=st, policy=p)
    st, _ = apply(st, hit("nvidia-xid-79", "hardware", 201.0, node="b", attempt=1), 201.0, p)
    st, _ = apply(st, Heartbeat("j", 1, "a", 202.5, True, 201.0), 203.0, p)
    _, decs = apply(st, Heartbeat("j", 1, "b", 202.0, True, 201.0), 203.0, p)
    assert decs[0].evidence["blacklist"]["b"] == {"strikes": 2, "duration_s": 200,
                                                  "until": 403.0}


def test_node_in_repeated_short_failed_attempts_becomes_suspect() -> None:
    p = Policy(settle_s=0, suspect_after=3, max_restarts=10, storm_max_restarts=10,
               fault_tolerant_policy="on_failure")
    st = JobState(job="j")
    decs: list = []
    for attempt in range(3):
        t = 100.0 + attempt * 100
        st = start(("a", "b"), attempt=attempt, ts=t, st=st, policy=p)
        st, _ = apply(st, Exit("j", attempt, "b", t + 10, 1), t + 10, p)
        st, decs = apply(st, Heartbeat("j", attempt, "a", t + 10, True, t + 5), t + 10, p)
    assert decs[0].evidence["blacklist_candidates"] == ["b"]
    assert st.short_fails == {"b": 3}


def test_restart_storm_guard() -> None:
    p = Policy(settle_s=0, max_restarts=100, storm_max_restarts=3, storm_window_s=60,
               restart_backoff_s=2, fault_tolerant_policy="on_failure")
    st = JobState(job="j")
    actions, hints = [], []
    for attempt in range(4):
        t = 100.0 + attempt
        st = start(attempt=attempt, ts=t, st=st, policy=p)
        st, decs = apply(st, Exit("j", attempt, "n0", t + 1, 1), t + 1, p)
        actions.append(decs[0].action)
        hints.append(decs[0].evidence.get("restart_not_before"))
    assert actions == ["restart", "restart", "restart", "fail"]
    assert hints[:3] == [101.0, 103.0, 106.0]  # now; last + 2 s; last + 4 s
    assert "storm" in decs[0].message


def test_notify_rule_action_does_not_loop() -> None:
    p = Policy(settle_s=0)
    st = start(policy=p)
    st, _ = apply(st, Hit("j", 0, "n0", Match("warn", "retryable", False, 101.0, "w",
                                             action="notify")), 101, p)
    st, decs = apply(st, Exit("j", 0, "n0", 102.0, 1), 102, p)
    assert [d.action for d in decs] == ["notify"] and st.phase == DECIDED


# ---- persistence -----------------------------------------------------------------------

def test_full_state_round_trips() -> None:
    st = start(("n0", "n1", "n2", "n3"), world=4, nnodes=4)
    st, _ = slow_run(st, 0, 101.0)
    st, _ = apply(st, Stage("j", 0, "n0", 170.0, 0, "checkpoint", True, 300.0), 170.0, AD)
    st, _ = apply(st, Notice("j", 0, "n0", 171.0, "retryable_errors", {"patterns": ["x"]}),
                     171.0, AD)
    st = out(st, 172.0)
    st, _ = apply(st, hit("nvidia-xid-79", "hardware", 173.0), 173.0, AD)
    st, _ = tick(st, 174.0, AD)
    import orjson

    again = JobState.from_dict(orjson.loads(orjson.dumps(st.to_dict())))
    assert again == st


def test_big_job_updates_copy_one_shard() -> None:
    st = start()
    ranks = tuple((r, 101.0) for r in range(10_000))
    st, _ = apply(st, Output("j", 0, "n0", 101.0, 10_000, ranks), 101.0, AD)
    assert len(st.rank_last_ts) == 10_000
    st2, _ = apply(st, Output("j", 0, "n0", 102.0, 1, ((5, 102.0),)), 102.0, AD)
    shared = sum(a is b for a, b in zip(st.rank_last_ts._shards, st2.rank_last_ts._shards,
                                        strict=True))
    assert shared == len(st.rank_last_ts._shards) - 1
    assert st2.rank_last_ts[5] == 102.0 and st.rank_last_ts[5] == 101.0
