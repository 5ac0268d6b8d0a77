"""Every window and threshold of the pure core at exactly its edge: just below, exactly at and
just above, with time passed in. The times are binary-exact (multiples of 1/4 s), so "exactly
at" is exact; a comparison written `>=` where `>` was meant (or back) turns one case red.

Where the edge is: a window of W seconds has passed at W (silence of the window decides), a
budget of N is spent by N uses, a threshold of X is exceeded only above X unless the policy's
doc says "at least".
"""

from __future__ import annotations

import dataclasses

import pytest

from faultwatch.core.blast import BlastGuard, Census
from faultwatch.core.decide import guard_restart
from faultwatch.core.events import Exit, Heartbeat, RunStart
from faultwatch.core.job import SETTLING, JobState, apply, tick
from faultwatch.core.pmap import PMap
from faultwatch.core.policy import Policy
from faultwatch.core.progress import SLOW_MIN_DELTA_S, SLOW_STRIKES, RankProg, scan_slow
from faultwatch.core.registry import (
    HEALTHY,
    QUARANTINED,
    SUSPECT,
    NodeRecord,
    RegistryPolicy,
    expire,
)
from faultwatch.core.silence import ERROR_EXIT_GRACE_S
from faultwatch.core.windows import MIN_SAMPLES, GapHist, OpenStage, choose_window
from tests.support.job_events import hb, hit, out, start, training

Q = 0.25  # "just": a quarter second either side of the edge
EDGE = pytest.mark.parametrize("d", [-Q, 0.0, Q], ids=["below", "at", "above"])


def kinds(decs: list) -> list[str]:
    return [d.kind for d in decs if d.kind != "diagnose"]


# ---- silence windows (event time: the heartbeats' own clock) ------------------------------

@EDGE
def test_exit_hang_window(d: float) -> None:
    """One node exited 0; the other still runs exit_hang_window_s later: exit hang."""
    p = Policy(exit_hang_window_s=10, hang_window_s=1000, diagnose=False)
    st = start(("a", "b"), policy=p)
    st, _ = apply(st, Exit("j", 0, "a", 110.0, 0), 110.0, p)
    now = 110.0 + 10 + d
    st, decs = hb(st, now, now - 1, node="b", policy=p)
    assert kinds(decs) == ([] if d < 0 else ["exit-hang"])


@EDGE
def test_fixed_hang_window(d: float) -> None:
    """Every rank silent for exactly hang_window_s is a hang."""
    p = Policy(hang_window_s=8, settle_s=0, diagnose=False)
    st = out(start(policy=p), 101.0, policy=p)
    st, decs = hb(st, 101.0 + 8 + d, 101.0, policy=p)
    assert kinds(decs) == ([] if d < 0 else ["hang"])


@EDGE
def test_init_window_before_the_first_output(d: float) -> None:
    """Nothing printed yet: the init window (from the run start) applies, not the hang window."""
    p = Policy(hang_window_s=8, init_window_s=20, settle_s=0, diagnose=False)
    st = start(policy=p)  # started at 100
    st, decs = hb(st, 100.0 + 20 + d, None, policy=p)
    assert kinds(decs) == ([] if d < 0 else ["hang"])


@EDGE
def test_a_lagging_heartbeat_inhibits_the_hang_past_half_the_node_lost_window(d: float) -> None:
    """Node b's last heartbeat is older than node_lost_s / 2 behind the freshest one: the hang
    waits (node-lost decides about b); exactly half behind is not lagging yet."""
    p = Policy(hang_window_s=5, node_lost_s=30, settle_s=0, diagnose=False)
    st = start(("a", "b"), policy=p)
    st, _ = hb(st, 106.0, 100.5, node="b", policy=p)  # b's silence proven past the window
    st, decs = hb(st, 106.0 + 15 + d, 100.5, node="a", policy=p)
    assert kinds(decs) == ([] if d > 0 else ["hang"])


@EDGE
def test_error_exit_grace(d: float) -> None:
    """For ERROR_EXIT_GRACE_S after a root error line the silence is the failing process's
    teardown; from then on a job that printed an error and hangs is hung."""
    p = Policy(hang_window_s=5, settle_s=0, diagnose=False)
    st = out(start(policy=p), 100.5, policy=p)
    st, decs = apply(st, hit("python-network-error", "retryable", 101.0), 101.0, p)
    assert decs == []
    now = 101.0 + ERROR_EXIT_GRACE_S + d
    st, decs = hb(st, now, 100.5, policy=p)
    assert kinds(decs) == ([] if d < 0 else ["hang"])


@EDGE
def test_missing_nodes_after_the_skew_window(d: float) -> None:
    """Fewer nodes than announced skew_warn_s after the first start: a notice."""
    p = Policy(skew_warn_s=60, hang_detection=False, diagnose=False)
    st = start(("a",), nnodes=2, policy=p)  # started at 100
    st, decs = hb(st, 100.0 + 60 + d, None, node="a", policy=p)
    assert kinds(decs) == ([] if d < 0 else ["skew"])


@EDGE
def test_start_skew(d: float) -> None:
    """Nodes of one attempt starting skew_warn_s apart: a notice."""
    p = Policy(skew_warn_s=60)
    st = start(("a",), policy=p)  # at 100
    st, decs = apply(st, RunStart("j", 0, "b", ts=100.0 + 60 + d), 100.0 + 60 + d, p)
    assert kinds(decs) == ([] if d < 0 else ["skew"])


# ---- processor-time windows ---------------------------------------------------------------

@EDGE
def test_node_lost_window(d: float) -> None:
    """A live node the processor has not heard from for node_lost_s is lost."""
    p = Policy(node_lost_s=30, hang_window_s=1000, diagnose=False)
    st, _ = apply(JobState(job="j"), RunStart("j", 0, "a", ts=100.0), 100.0, p)
    st, _ = apply(st, Heartbeat("j", 0, "a", 101.0, True, 101.0), 101.0, p)
    st, decs = tick(st, 101.0 + 30 + d, p, live_clock=True)
    assert kinds(decs) == ([] if d < 0 else ["node-lost"])


def _settling(p: Policy) -> JobState:
    """Node a failed (seen at processor time 200); node b never says more."""
    st = start(("a", "b"), policy=p)
    st, _ = apply(st, Heartbeat("j", 0, "b", 105.0, True, 105.0), 105.0, p)
    st, decs = apply(st, Exit("j", 0, "a", 110.0, 1), 200.0, p)
    assert decs == [] and st.phase == SETTLING
    return st


@EDGE
def test_settle_timeout_in_processor_time(d: float) -> None:
    """A settling failure whose other nodes never report is decided settle_s + node_lost_s
    of processor time after it was seen (when the processor is caught up)."""
    p = Policy(settle_s=4, node_lost_s=30, hang_window_s=1000, diagnose=False)
    st, decs = tick(_settling(p), 200.0 + 4 + 30 + d, p)
    assert (decs != []) == (d >= 0)


@EDGE
def test_settle_of_a_state_without_event_time(d: float) -> None:
    """A failure written before event-time settling (no failure_ts) settles settle_s of
    processor time after it was seen."""
    p = Policy(settle_s=4, node_lost_s=30, hang_window_s=1000, diagnose=False)
    st = dataclasses.replace(_settling(p), failure_ts=None)
    st, decs = tick(st, 200.0 + 4 + d, p)
    assert (decs != []) == (d >= 0)


@EDGE
def test_settle_horizon_in_event_time(d: float) -> None:
    """The other node's heartbeat stamped settle_s after the failure completes the evidence."""
    p = Policy(settle_s=4, node_lost_s=30, hang_window_s=1000, diagnose=False)
    st = _settling(p)
    st, decs = apply(st, Heartbeat("j", 0, "b", 110.0 + 4 + d, True, 105.0), 201.0, p)
    assert (decs != []) == (d >= 0)


# ---- budgets and storms -------------------------------------------------------------------

@pytest.mark.parametrize("used, action", [(2, "restart"), (3, "fail")])
def test_restart_budget(used: int, action: str) -> None:
    """max_restarts restarts are allowed; the one after them fails the job."""
    p = Policy(max_restarts=3)
    assert guard_restart("restart", "m", 1000.0, p, used, ()).action == action


@EDGE
def test_restart_storm_window(d: float) -> None:
    """A restart exactly storm_window_s ago has left the window."""
    p = Policy(max_restarts=100, storm_window_s=600, storm_max_restarts=2)
    now = 10_000.0
    times = (now - 600 - d, now - 10)  # the older one just inside / exactly at / outside
    g = guard_restart("restart", "m", now, p, 2, times)
    assert g.action == ("fail" if d < 0 else "restart")


@pytest.mark.parametrize("recent, action", [(1, "restart"), (2, "fail")])
def test_restart_storm_count(recent: int, action: str) -> None:
    """storm_max_restarts restarts within the window: the next one fails."""
    p = Policy(max_restarts=100, storm_window_s=600, storm_max_restarts=2)
    times = tuple(1000.0 - 10 * i for i in range(recent))
    assert guard_restart("restart", "m", 1000.0, p, recent, times).action == action


def _fail_once(st: JobState, attempt: int, p: Policy, t: float) -> tuple[JobState, list]:
    st = start(("n0",), attempt=attempt, ts=t, st=st, policy=p)
    st, _ = apply(st, hit("python-network-error", "retryable", t + 1, attempt=attempt),
                  t + 1, p)
    return apply(st, Exit("j", attempt, "n0", t + 2, 1), t + 2, p)


@pytest.mark.parametrize("repeats, action", [(2, "restart"), (3, "fail")])
def test_max_same_error(repeats: int, action: str) -> None:
    """The same error on one instance more than max_same_error times fails the job."""
    p = Policy(max_same_error=2, max_restarts=100, storm_max_restarts=100, settle_s=0)
    st: JobState | None = None
    decs: list = []
    for attempt in range(repeats):
        st, decs = _fail_once(st or JobState(job="j"), attempt, p, 1000.0 * (attempt + 1))
    assert [d.action for d in decs] == [action]


@pytest.mark.parametrize("failed, action", [(1, "restart"), (2, "fail")])
def test_max_failure_rate(failed: int, action: str) -> None:
    """Async mode: a fraction of failed nodes above max_failure_rate fails the job; exactly
    at the rate restarts the failed ones."""
    p = Policy(execution_mode="async", max_failure_rate=0.25, settle_s=0, max_restarts=10)
    nodes = ("a", "b", "c", "d")
    st = start(nodes, policy=p)
    for n in nodes:
        st, _ = apply(st, Heartbeat("j", 0, n, 105.0, True, 105.0), 105.0, p)
    for n in nodes[:failed]:
        st, _ = apply(st, hit("python-network-error", "retryable", 110.0, node=n), 110.0, p)
    decs: list = []
    for n in nodes[:failed]:
        st, decs = apply(st, Exit("j", 0, n, 111.0, 1), 111.0, p)
    for n in nodes[failed:]:  # the others' heartbeats past the settle horizon
        st, more = apply(st, Heartbeat("j", 0, n, 112.0, True, 105.0), 112.0, p)
        decs += more
    assert [d.action for d in decs] == [action]


@EDGE
def test_short_attempt(d: float) -> None:
    """A failed attempt shorter than short_attempt_s counts against its node; exactly as long
    is not short."""
    p = Policy(short_attempt_s=300, settle_s=0, hang_window_s=1000, diagnose=False)
    st = start(policy=p)  # started at 100
    end = 100.0 + 300 + d
    st, decs = apply(st, Exit("j", 0, "n0", end, 1), end, p)
    assert decs and st.short_fails.get("n0", 0) == (1 if d < 0 else 0)


# ---- the node registry --------------------------------------------------------------------

@EDGE
def test_quarantine_expires_at_until(d: float) -> None:
    rp = RegistryPolicy(quarantine_s=1800, probation_s=3600)
    rec = NodeRecord("n1", state=QUARANTINED, until=5000.0, strikes=1)
    assert expire(rec, 5000.0 + d, rp).state == (QUARANTINED if d < 0 else SUSPECT)


@EDGE
def test_probation_ends_at_until(d: float) -> None:
    rp = RegistryPolicy(quarantine_s=1800, probation_s=3600)
    rec = NodeRecord("n1", state=SUSPECT, until=9000.0, strikes=1, probation=True)
    assert expire(rec, 9000.0 + d, rp).state == (SUSPECT if d < 0 else HEALTHY)


# ---- the adaptive window ------------------------------------------------------------------

@pytest.mark.parametrize("samples, learned", [(MIN_SAMPLES - 1, False), (MIN_SAMPLES, True)])
def test_learned_window_needs_min_samples(samples: int, learned: bool) -> None:
    p = Policy(hang_floor_s=10, hang_ceiling_s=600)
    h = GapHist().add(2.0, samples)
    assert (h.learned(p) is not None) == learned


def test_learned_window_is_clamped_to_floor_and_ceiling() -> None:
    p = Policy(hang_floor_s=10, hang_ceiling_s=600)
    assert GapHist().add(0.5, MIN_SAMPLES).learned(p) == 10.0  # tiny gaps: the floor
    assert GapHist().add(1000.0, MIN_SAMPLES).learned(p) == 600.0  # huge gaps: the ceiling
    mid = GapHist().add(20.0, MIN_SAMPLES).learned(p)
    assert mid is not None and 10.0 < mid < 600.0


# ---- the fleet-storm guard (blast radius) -------------------------------------------------

def _census(silent: int, jobs: int) -> Census:
    keys = frozenset(f"j{i}".encode() for i in range(silent))
    return Census(jobs=jobs, nodes=jobs, silent=keys, silent_nodes=silent)


@pytest.mark.parametrize("silent, held", [(2, False), (3, True)])
def test_fleet_storm_min_jobs(silent: int, held: bool) -> None:
    """fleet_storm_min_jobs silent jobs (all of them: share 1) trip the guard; one fewer is
    a set of lone losses, each acted on."""
    p = Policy(fleet_storm_min_jobs=3, fleet_storm_share=0.5)
    g = BlastGuard()
    acted = g.consider(b"j0", 0, "node-lost", "restart", 100.0, p, lambda: _census(silent, silent))
    assert acted is not held and g.holding is held


@pytest.mark.parametrize("silent, held", [(4, False), (5, True)])
def test_fleet_storm_share(silent: int, held: bool) -> None:
    """Silent jobs at exactly fleet_storm_share of the active ones trip the guard."""
    p = Policy(fleet_storm_min_jobs=3, fleet_storm_share=0.5)
    g = BlastGuard()
    acted = g.consider(b"j0", 0, "hang", "restart", 100.0, p, lambda: _census(silent, 10))
    assert acted is not held


@EDGE
def test_fleet_storm_hold_lasts_hold_max(d: float) -> None:
    """A hold ends (its jobs lapse to the slow release) fleet_storm_hold_max_s after it
    tripped."""
    p = Policy(fleet_storm_min_jobs=3, fleet_storm_share=0.5, fleet_storm_hold_max_s=600)
    g = BlastGuard()
    assert not g.consider(b"j0", 0, "node-lost", "restart", 100.0, p, lambda: _census(5, 5))
    g.step(100.0 + 600 + d, p)
    assert g.holding is (d < 0)


@EDGE
def test_fleet_storm_window_after_a_return(d: float) -> None:
    """A job released by its return is not acted on for the held silence within
    fleet_storm_window_s of coming back; from then on it is judged afresh."""
    p = Policy(fleet_storm_min_jobs=3, fleet_storm_share=0.5, fleet_storm_window_s=30)
    g = BlastGuard()
    assert not g.consider(b"j0", 0, "node-lost", "restart", 100.0, p, lambda: _census(5, 5))
    for i in range(5):
        g.returned(f"j{i}".encode(), 200.0)
    g.step(200.0, p)
    assert not g.holding
    acted = g.consider(b"j0", 0, "node-lost", "restart", 200.0 + 30 + d, p,
                       lambda: _census(1, 5))
    assert acted is (d >= 0)


@EDGE
def test_progress_stall_window(d: float) -> None:
    """Output keeps flowing but no step advanced for the window: a progress stall."""
    p = Policy(hang_window_s=8, settle_s=0, diagnose=False)
    st, last = training(start(policy=p), 101.0, 161.0, policy=p)  # last step at `last`
    now = last + 8 + d
    for t in (last + 1, last + 2, last + 3, now - 1):
        st = out(st, t, text="NCCL WARN retrying", policy=p)
    st, decs = hb(st, now, now - 1, policy=p)
    assert kinds(decs) == ([] if d < 0 else ["progress-stall"])


# ---- slow ranks and a stage's declared window ---------------------------------------------

def _ranks(*times: float) -> PMap[int, RankProg]:
    return PMap({r: RankProg(10, 100.0, t) for r, t in enumerate(times)})


@EDGE
def test_slow_rank_factor(d: float) -> None:
    """A rank is an outlier only above slow_factor x the job's low median (2 x 1 s here);
    exactly at the factor it is not."""
    progress = _ranks(1.0, 1.0, 2.0 + d)
    _, _, med = scan_slow(progress, 2.0)
    assert med == 1.0
    strikes = scan_slow(progress, 2.0)[0][2].strikes
    assert strikes == (1 if d > 0 else 0)


@pytest.mark.parametrize("delta, slow", [(SLOW_MIN_DELTA_S / 2, False), (SLOW_MIN_DELTA_S, True)])
def test_slow_rank_minimum_delta(delta: float, slow: bool) -> None:
    """An outlier by less than SLOW_MIN_DELTA_S is timer noise; by exactly that it counts."""
    progress = _ranks(0.0, 0.0, delta)  # above the factor either way (the median is 0)
    assert (scan_slow(progress, 2.0)[0][2].strikes == 1) is slow


def test_slow_rank_is_reported_at_exactly_slow_strikes_scans() -> None:
    progress = _ranks(1.0, 1.0, 5.0)
    reached_at = []
    for scan in range(1, SLOW_STRIKES + 2):
        progress, reached, _ = scan_slow(progress, 2.0)
        if reached:
            reached_at.append(scan)
    assert reached_at == [SLOW_STRIKES]  # once, at the SLOW_STRIKES-th scan, not again


@pytest.mark.parametrize("gap, lengthened", [(1.0, False), (100.0, True)])
def test_a_stage_window_is_lengthened_by_what_was_learned_never_shortened(
        gap: float, lengthened: bool) -> None:
    p = Policy(hang_floor_s=1, hang_ceiling_s=600)
    hist = GapHist().add(gap, MIN_SAMPLES)
    learned = hist.learned(p)
    assert learned is not None
    window, basis = choose_window(p, [OpenStage("eval", 60.0, 100.0)], PMap({"eval": hist}),
                                  True)
    assert basis["basis"] == "stage" and basis["declared_s"] == 60.0
    assert window == (learned if lengthened else 60.0)
    assert ("learned" in basis) is lengthened
