"""Divergence (core/divergence.py): NaN/inf losses and loss spikes, time passed in."""

from __future__ import annotations

import math

import pytest

from faultwatch.core.events import LossBatch, Progress, RankLoss, RunStart
from faultwatch.core.job import DECIDED, RUNNING, JobState, apply
from faultwatch.core.policy import Policy
from faultwatch.errors import ConfigError

P = Policy(settle_s=0, diagnose=False)


def started(policy: Policy = P, nodes: tuple[str, ...] = ("n0", "n1")) -> JobState:
    st = JobState(job="j")
    for n in nodes:
        st, _ = apply(st, RunStart("j", 0, n, ts=100.0), 100.0, policy)
    return st


def losses(st: JobState, values: list[float], t0: float = 110.0, node: str = "n0",
           rank: int | None = 0, policy: Policy = P) -> tuple[JobState, list]:
    marks = tuple(RankLoss(rank, t0 + i, v, "loss") for i, v in enumerate(values))
    return apply(st, LossBatch("j", 0, node, marks), t0 + len(values), policy)


def test_healthy_losses_decide_nothing_and_a_nan_is_one_notice() -> None:
    st = started()
    healthy = [2.5 - 0.01 * i for i in range(60)] + [2.0, 2.3, 1.9, 2.2]  # noise, no spike
    st, decs = losses(st, healthy)
    assert decs == [] and len(st.losses) == P.loss_window
    st, decs = losses(st, [1.8, math.nan, math.nan, math.inf], t0=200.0, rank=1)
    assert [(d.action, d.kind, d.ranks, d.nodes) for d in decs] == [
        ("notify", "divergence", (1,), ("n0",))]
    d = decs[0]
    assert d.ts == 201.0 and "loss is nan" in d.message and "rank 1" in d.message
    assert d.evidence["loss"] == "nan" and d.evidence["median"] is not None
    assert st.phase == RUNNING  # a notice: the job runs on
    st, decs = losses(st, [math.nan], t0=300.0)
    assert decs == []  # once per attempt


def test_spike_over_the_running_median_is_noticed_a_small_rise_is_not() -> None:
    st = started()
    st, decs = losses(st, [2.0] * 10 + [5.9])  # 2.95x the median: under the factor 3
    assert decs == []
    st, decs = losses(st, [6.5], t0=130.0)  # 3.25x
    assert [(d.action, d.kind) for d in decs] == [("notify", "divergence")]
    assert "spiked" in decs[0].message and decs[0].evidence["factor"] == 3.0


def test_no_spike_before_enough_samples_or_with_a_non_positive_median() -> None:
    st = started()
    st, decs = losses(st, [1.0, 1.0, 1.0, 50.0])  # 3 samples only
    assert decs == []
    st2 = started()
    st2, decs = losses(st2, [0.0] * 10 + [5.0])  # median 0
    assert decs == []


@pytest.mark.parametrize("action", ["restart", "fail"])
def test_configured_action_is_taken_for_a_nan_loss(action: str) -> None:
    p = Policy(settle_s=0, diagnose=False, divergence_action=action)
    st = started(p)
    st, decs = losses(st, [2.0, 2.1, math.nan], policy=p)
    assert [(d.action, d.kind, d.nodes) for d in decs] == [(action, "divergence",
                                                            ("n0", "n1"))]
    assert st.phase == DECIDED
    if action == "restart":
        assert decs[0].evidence["resume"] == "last checkpoint"
        assert st.restarts_used == 1
    assert "restarting from the last checkpoint" in decs[0].message or action == "fail"


def test_detection_off_and_sdk_progress_loss() -> None:
    off = Policy(settle_s=0, diagnose=False, divergence_detection=False)
    st = started(off)
    st, decs = losses(st, [math.nan], policy=off)
    assert decs == []
    st = started()
    st, decs = apply(st, Progress("j", 0, "n1", 120.0, 3, 7, step_time_s=0.5, source="sdk",
                                  loss=math.inf), 120.0, P)
    assert [(d.kind, d.ranks, d.evidence["key"]) for d in decs] == [
        ("divergence", (3,), "sdk:loss")]


def test_state_round_trips_and_a_new_attempt_forgets_the_losses() -> None:
    st = started()
    st, _ = losses(st, [2.0, 2.5, 3.0])
    back = JobState.from_dict(st.to_dict())
    assert back.losses == (2.0, 2.5, 3.0)
    st, _ = apply(st, RunStart("j", 1, "n0", ts=500.0), 500.0, P)
    assert st.losses == ()


def test_policy_refuses_bad_divergence_settings() -> None:
    with pytest.raises(ConfigError):
        Policy(divergence_action="explode")
    with pytest.raises(ConfigError):
        Policy(loss_spike_factor=1.0)
    with pytest.raises(ConfigError):
        Policy(loss_window=1)
