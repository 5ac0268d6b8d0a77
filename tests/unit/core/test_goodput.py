"""Goodput accounting over a run ledger (core/ledger, timeline, incidents, goodput): every
part of a known timeline, the parts summing to wall time, lost work, clamping, bounds."""

from __future__ import annotations

import dataclasses

import pytest

from faultwatch.core import ledger as ledger_mod
from faultwatch.core import timeline
from faultwatch.core.events import (
    Decision,
    Exit,
    Progress,
    ProgressBatch,
    RankStep,
    RunStart,
    Signal,
    Stage,
)
from faultwatch.core.goodput import PARTS, Account, account, fleet, fmt_s, summarise
from faultwatch.core.incidents import cause_of, lost_phrase
from faultwatch.core.ledger import Ledger
from faultwatch.core.timeline import observe

J = "job"


class Run:
    """A synthetic run: signals and decisions folded in order, as the job stage does."""

    def __init__(self) -> None:
        self.led = Ledger()

    def sig(self, *sigs: Signal) -> Run:
        self.led = observe(self.led, list(sigs), [], summarise=summarise)
        return self

    def decide(self, d: Decision) -> Run:
        self.led = observe(self.led, [], [d], summarise=summarise)
        return self

    def start(self, attempt: int, ts: float, node: str = "n0") -> Run:
        return self.sig(RunStart(J, attempt, node, ts, run_id="r1"))

    def steps(self, attempt: int, first: int, ts0: float, n: int, dt: float = 1.0,
              node: str = "n0", rank: int | None = 0) -> Run:
        for k in range(n):
            self.sig(Progress(J, attempt, node, ts0 + k * dt, rank, first + k))
        return self

    def stage(self, attempt: int, name: str, t0: float, t1: float, step: int | None = None,
              rank: int | None = 0) -> Run:
        return self.sig(Stage(J, attempt, "n0", t0, rank, name, True, step=step),
                        Stage(J, attempt, "n0", t1, rank, name, False, step=step))


def error(attempt: int, ts: float, first: float, rule: str = "connection-refused",
          action: str = "restart", category: str = "retryable", node: str = "n0") -> Decision:
    return Decision(f"d{attempt}", J, attempt, action, "error", ts, nodes=(node,), rule=rule,
                    category=category, evidence={"first_error": {"ts": first, "node": node}})


def parts(led: Ledger) -> dict[str, float]:
    acc = account(led)
    return {"productive": round(acc.productive_s, 6),
            **{k: round(v, 6) for k, v in acc.badput.items() if v}}


def crash_after_checkpoint() -> Run:
    """Launch 0; steps 1-10 at 10..19; a checkpoint 19.5-21.5 (step 10); steps 11-14 at
    22..25; an error at 25.5, exit 25.6, decided at 28; relaunch 30, steps 11-20 at 40..49,
    exit 0 at 50."""
    r = Run().start(0, 0.0).steps(0, 1, 10.0, 10)
    r.stage(0, "checkpoint", 19.5, 21.5, step=10).steps(0, 11, 22.0, 4)
    r.sig(Exit(J, 0, "n0", 25.6, 1)).decide(error(0, 28.0, 25.5))
    r.start(1, 30.0).steps(1, 11, 40.0, 10).sig(Exit(J, 1, "n0", 50.0, 0))
    return r


def test_a_crash_after_a_checkpoint_every_part_and_the_incident_timeline() -> None:
    led = crash_after_checkpoint().led
    assert parts(led) == {"productive": 18.5, "startup": 10.0, "checkpoint": 2.0,
                          "lost_work": 4.0, "detection": 2.5, "restart": 12.0, "other": 1.0}
    acc = account(led)
    assert acc.wall_s == 50.0 and acc.ratio == pytest.approx(18.5 / 50)
    assert not acc.upper_bound and acc.clamped == 0
    (i,) = led.incidents
    assert (i.cause, i.first_sign_ts, i.detected_ts, i.acted_ts, i.recovered_ts) == \
        ("error", 25.5, 28.0, 30.0, 40.0)
    assert (i.last_progress_step, i.ckpt_step, i.lost_steps, i.lost_s) == (14, 10, 4, 4.0)
    assert lost_phrase(i, "iteration") == \
        "lost 4 iterations, 4.0 s, since the checkpoint at iteration 10"
    assert acc.line() == ("goodput 37.0 % of 50.0s: 12.0s restart, 10.0s start-up, "
                          "4.0s lost work, 2.5s detection, 2.0s checkpoint, 1.0s other")


def test_a_hang_is_silence_then_restart_and_an_eval_is_its_own_part() -> None:
    r = Run().start(0, 0.0).steps(0, 1, 5.0, 10)  # steps 5..14
    r.stage(0, "eval", 14.5, 17.5).steps(0, 11, 18.0, 3)  # 18, 19, 20
    r.stage(0, "checkpoint", 20.2, 20.8, step=13)
    r.steps(0, 14, 21.0, 2)  # 21, 22: then silent
    r.decide(Decision("h", J, 0, "restart", "hang", 30.0, ranks=(1,),
                      evidence={"silent_since": 22.0, "culprit_nodes": {"n1": 1}}))
    r.start(1, 31.0).steps(1, 14, 35.0, 3).sig(Exit(J, 1, "n0", 38.0, 0))
    p = parts(r.led)
    assert p == {"productive": 14.2, "startup": 5.0, "eval": 3.0, "checkpoint": 0.6,
                 "lost_work": 1.2, "hang_silence": 8.0, "restart": 5.0, "other": 1.0}
    assert sum(p.values()) == pytest.approx(38.0)
    (i,) = r.led.incidents
    assert (i.cause, i.nodes, i.ranks, i.lost_steps) == ("hang", ("n1",), (1,), 2)


def test_a_crash_long_after_the_last_checkpoint_loses_every_step_since() -> None:
    r = Run().start(0, 0.0).steps(0, 1, 2.0, 5).stage(0, "checkpoint", 6.5, 7.0, step=5)
    r.steps(0, 6, 8.0, 30)  # steps 6..35 at 8..37
    r.decide(error(0, 39.0, 38.0))
    (i,) = r.led.incidents
    assert (i.lost_steps, i.lost_s, i.ckpt_step) == (30, 31.0, 5)
    assert parts(r.led)["lost_work"] == 31.0


def test_a_lost_node_and_a_preemption_wait_for_the_scheduler() -> None:
    r = Run().start(0, 0.0).steps(0, 1, 1.0, 5)
    r.decide(Decision("l", J, 0, "restart", "node-lost", 20.0, nodes=("n0", "n1"),
                      evidence={"lost_nodes": {"n1": {"last_heartbeat_ts": 6.0,
                                                      "silent_for_s": 14.0}}}))
    r.start(1, 26.0).steps(1, 1, 30.0, 2)
    r.decide(error(1, 33.0, 32.0, rule="torchrun-death-signal"))
    r.start(2, 40.0).steps(2, 1, 41.0, 1).sig(Exit(J, 2, "n0", 42.0, 0))
    lost, pre = r.led.incidents
    assert (lost.cause, lost.nodes, lost.first_sign_ts) == ("node-lost", ("n1",), 6.0)
    assert pre.cause == "preemption"
    p = parts(r.led)
    assert p["waiting"] == (26.0 - 20.0) + (40.0 - 33.0)
    assert p["detection"] == (20.0 - 6.0) + (33.0 - 32.0)


def test_an_operator_stop_is_an_incident_and_the_time_stopped_is_waiting() -> None:
    r = Run().start(0, 0.0).steps(0, 1, 1.0, 3).sig(Exit(J, 0, "n0", 5.0, 143, 15,
                                                        stopped=True))
    r.start(1, 60.0).steps(1, 1, 61.0, 2).sig(Exit(J, 1, "n0", 63.0, 0))
    (i,) = r.led.incidents
    assert (i.cause, i.action, i.first_sign_ts, i.detected_ts) == ("operator-stop", "stop",
                                                                    5.0, 5.0)
    assert parts(r.led)["waiting"] == 55.0


def test_no_progress_lines_at_all_is_goodput_unknown_not_zero_or_full() -> None:
    r = Run().start(0, 0.0).sig(Exit(J, 0, "n0", 5.0, 1)).decide(error(0, 6.0, 5.0))
    r.start(1, 7.0).sig(Exit(J, 1, "n0", 20.0, 0))
    acc = account(r.led)
    assert acc.ratio is None and acc.wall_s == 20.0
    assert acc.line().startswith("goodput unknown (no training progress seen) of 20.0s")
    assert r.led.incidents[0].lost_known and r.led.incidents[0].lost_steps == 0


def test_without_a_checkpoint_lost_work_is_unknown_and_goodput_an_upper_bound() -> None:
    r = Run().start(0, 0.0).steps(0, 1, 1.0, 10).decide(error(0, 12.0, 11.0))
    r.start(1, 13.0).steps(1, 1, 14.0, 5).sig(Exit(J, 1, "n0", 19.0, 0))
    (i,) = r.led.incidents
    assert not i.lost_known and i.lost_steps is None and i.lost_s is None
    assert lost_phrase(i) == "lost work unknown (no checkpoint seen)"
    acc = account(r.led)
    assert acc.upper_bound and acc.lost_unknown == 1 and acc.badput["lost_work"] == 0.0
    assert acc.line().startswith("goodput <= ") and "no checkpoint seen" in acc.line()


def test_clock_skew_is_clamped_counted_and_the_parts_still_sum_to_wall() -> None:
    r = Run().start(0, 10.0).steps(0, 1, 8.0, 3)  # a node's clock 2 s behind: steps first
    r.decide(error(0, 11.0, 12.5))  # the decision stamped before its first sign
    r.start(1, 15.0).steps(1, 1, 16.0, 2).sig(Exit(J, 1, "n0", 18.0, 0))
    acc = account(r.led)
    assert acc.clamped >= 2
    assert all(v >= 0 for v in acc.badput.values()) and acc.productive_s >= 0
    assert acc.productive_s + sum(acc.badput.values()) == pytest.approx(acc.wall_s)
    assert acc.wall_s == pytest.approx(8.0)


def test_ranks_overlapping_in_a_stage_count_once_and_a_progress_batch_orders_by_time() -> None:
    r = Run().start(0, 0.0).steps(0, 1, 1.0, 2)
    r.sig(Stage(J, 0, "n0", 3.0, 0, "checkpoint", True), Stage(J, 0, "n0", 3.5, 1,
                                                              "checkpoint", True))
    r.sig(Stage(J, 0, "n0", 5.0, 0, "checkpoint", False),
          ProgressBatch(J, 0, "n0", (RankStep(0, 2.5, 2),)),  # before the close: its step
          Stage(J, 0, "n0", 6.0, 1, "checkpoint", False))
    assert r.led.attempts[0].spans == (("checkpoint", 3.0, 6.0),)
    assert r.led.ckpt is not None and r.led.ckpt.step == 2 and r.led.ckpt.ts == 6.0


def test_the_checkpoint_step_comes_from_its_line_then_its_opening_then_the_last_step() -> None:
    r = Run().start(0, 0.0).steps(0, 1, 1.0, 7)
    r.sig(Stage(J, 0, "n0", 8.0, 0, "checkpoint", True, step=6),
          Stage(J, 0, "n0", 9.0, 0, "checkpoint", False))
    assert r.led.ckpt is not None and r.led.ckpt.step == 6  # the opening line's
    r.stage(0, "checkpoint", 10.0, 11.0, step=5)
    assert r.led.ckpt.step == 5  # the line says so, not the last step (7)
    r.stage(0, "checkpoint-load", 12.0, 12.5)
    assert r.led.ckpt.ts == 11.0  # a load is no new checkpoint


def test_a_reused_name_starts_a_new_account() -> None:
    from faultwatch.core.state import JobState
    from faultwatch.core.timeline import fold_job

    st = fold_job(None, JobState(job=J), [RunStart(J, 0, "n0", 1.0, run_id="a",
                                                   run_source="slurm")], [])
    st = dataclasses.replace(st, run_id="a")
    new = dataclasses.replace(JobState(job=J), run_id="b")
    folded = fold_job(st, new, [Progress(J, 0, "n0", 2.0, 0, 9),
                                RunStart(J, 0, "n0", 3.0, run_id="b", run_source="slurm")], [])
    assert folded.ledger.run_id == "b" and folded.ledger.first_ts == 3.0
    assert folded.ledger.samples == ()  # the old run's step stayed with the old run


def test_attempts_past_the_detail_window_are_summed_exactly(monkeypatch: pytest.MonkeyPatch
                                                             ) -> None:
    def many() -> Ledger:
        r = Run()
        for a in range(40):
            t = a * 10.0
            r.start(a, t).steps(a, 1, t + 2, 3).stage(a, "checkpoint", t + 5.2, t + 5.5,
                                                      step=3)
            r.steps(a, 4, t + 6, 2).decide(error(a, t + 9.0, t + 8.0))
        return r.led

    small = many()
    monkeypatch.setattr(timeline, "MAX_ATTEMPTS", 1000)
    monkeypatch.setattr(timeline, "MAX_INCIDENTS", 1000)
    full = many()
    assert len(small.attempts) == ledger_mod.MAX_ATTEMPTS == 16
    assert small.earlier_attempts == 24 and len(full.attempts) == 40
    assert len(small.incidents) == 32 and small.incidents_dropped == 8
    a, b = account(small), account(full)
    assert a.wall_s == pytest.approx(b.wall_s) and a.productive_s == pytest.approx(b.productive_s)
    for k in PARTS:
        assert a.badput[k] == pytest.approx(b.badput[k]), k
    assert a.incidents == b.incidents == 40


def test_a_ledger_round_trips_through_its_dict() -> None:
    led = crash_after_checkpoint().led
    assert Ledger.from_dict(led.to_dict()) == led


def test_causes_of_decisions() -> None:
    assert cause_of("progress-stall", None) == "hang"
    assert cause_of("exit", "exit-sigterm") == "preemption"
    assert cause_of("error", "k8s-eviction-or-disruption") == "preemption"
    assert cause_of("error", "cuda-oom") == "error"
    assert cause_of("divergence", None) == "divergence"


def test_fleet_figures() -> None:
    runs: list[Ledger] = [crash_after_checkpoint().led]
    r = Run().start(0, 0.0).steps(0, 1, 1.0, 9).sig(Exit(J, 0, "n0", 10.0, 0))
    runs.append(dataclasses.replace(r.led, job="other"))
    runs.append(Run().start(0, 0.0).sig(Exit(J, 0, "n0", 4.0, 0)).led)  # unknown
    f = fleet(runs)
    assert f["runs"] == 3 and f["runs_unknown"] == 1
    assert f["wall_s"] == 60.0 and f["productive_s"] == pytest.approx(18.5 + 8.0)
    assert f["ettr"] == pytest.approx(26.5 / 60, abs=1e-5)
    assert f["incidents_by_cause"] == {"error": 1}
    assert f["mttf_s"] == {"error": 64.0} and f["ttr_p50_s"] == 14.5
    assert f["incidents_per_1000_node_hours"] == pytest.approx(1000 / (64 / 3600), rel=1e-3)
    assert fleet(runs, since=1e9)["runs"] == 0


@pytest.mark.parametrize(("s", "text"), [(3.24, "3.2s"), (424, "7m04s"), (7980, "2h13m")])
def test_durations_read_like_the_issue(s: float, text: str) -> None:
    assert fmt_s(s) == text



def test_steps_other_ranks_finish_after_the_decision_are_lost_too() -> None:
    """A lost node's peers train on until the restart stops them: every step since the
    checkpoint is done again; the lost seconds still end at the first sign."""
    r = Run().start(0, 0.0).steps(0, 1, 1.0, 5).stage(0, "checkpoint", 5.5, 6.0, step=5)
    r.steps(0, 6, 7.0, 3)  # 6, 7, 8
    r.decide(Decision("l", J, 0, "restart", "node-lost", 12.0,
                      evidence={"lost_nodes": {"n1": {"last_heartbeat_ts": 9.0}}}))
    assert r.led.incidents[0].lost_steps == 3
    r.steps(0, 9, 12.5, 3)  # 9, 10, 11: before the agent stops the old processes
    (i,) = r.led.incidents
    assert (i.lost_steps, i.lost_s) == (6, 3.0)


def test_a_held_failure_is_an_operator_stop_and_the_job_waits_for_the_operator() -> None:
    d = error(0, 6.0, 5.0)
    held = dataclasses.replace(d, id="h0", action="notify", message="held by ops: ...",
                               evidence={**d.evidence, "held": {"by": "ops", "action":
                                                                "restart"}})
    r = Run().start(0, 0.0).steps(0, 1, 1.0, 3).sig(Exit(J, 0, "n0", 5.0, 1)).decide(held)
    r.start(1, 100.0).steps(1, 1, 101.0, 2).sig(Exit(J, 1, "n0", 103.0, 0))
    (i,) = r.led.incidents
    assert (i.cause, i.action, i.kind, i.rule) == ("operator-stop", "held", "error",
                                                   "connection-refused")
    assert parts(r.led)["waiting"] == 94.0 and i.recovered_ts == 101.0
    notice = dataclasses.replace(d, id="n0", action="notify", evidence={})
    assert Run().start(0, 0.0).decide(notice).led.incidents == ()  # a plain notice: none


def test_a_run_of_a_blink_has_no_ratio_in_its_line() -> None:
    """A run of 0.04 s says it was not measured, not `goodput <= 1.0 % ... no badput`."""
    acc = Account(0.04, 0.0004, {}, 0.01)
    assert acc.line() == "goodput not measured: the run lasted 0.0s"
