"""The adaptive window learned from what frameworks print: a \\r progress bar shipped
rate-limited (few outputs, many steps), and logs that report every N iterations."""

from __future__ import annotations

from faultwatch.core.job import JobState
from faultwatch.core.policy import Policy
from faultwatch.core.windows import MIN_SAMPLES, STEPS_HIST, GapHist, describe_basis
from tests.support.job_events import hb, out, prog, start

P = Policy(hang_floor_s=30, hang_ceiling_s=600, settle_s=0)


def bar(st: JobState, t0: float, counters: list[int], every_s: float = 1.0
        ) -> tuple[JobState, float]:
    """A tqdm bar redrawn every step, shipped once a second: one output per redraw shipped,
    the counter jumping by many steps between them."""
    t = t0
    for n in counters:
        st = out(st, t, text=f" 42%|####  | {n}/60 [00:02<00:03, 10.35it/s]", policy=P)
        st, _ = prog(st, t, n, policy=P)
        t += every_s
    return st, t - every_s


def first_hang(st: JobState, last: float, until: float) -> tuple[float, list]:
    t = last
    while t < until:
        t += 0.5
        st, decs = hb(st, t, last, policy=P)
        if decs:
            return t, decs
    return t, []


def test_a_short_bar_teaches_the_window_from_its_counter() -> None:
    # 25 steps in ~3 s, seen as 4 redraws: far too few outputs for the output-gap histogram
    st = start(policy=P)
    st, last = bar(st, 101.0, [1, 8, 17, 25])
    assert st.hists.get("", GapHist()).n < MIN_SAMPLES
    at, decs = first_hang(st, last, last + 700)
    assert [d.kind for d in decs] == ["hang"], at
    assert at - last <= 31.0  # the floor, not the 600 s ceiling
    w = decs[0].evidence["window"]
    assert w["basis"] == "adaptive" and w["learned_from"] == "progress steps"
    assert w["learned"]["samples"] >= MIN_SAMPLES
    assert "adaptive from progress steps" in decs[0].message


def test_a_job_that_logs_every_50_iterations_gets_a_window_longer_than_its_interval() -> None:
    # iteration lines 60 s apart, 50 steps each: the steps count, but the gap is the 60 s
    st = start(policy=P)
    t = 101.0
    for i in range(1, 4):
        st = out(st, t, text=f" iteration {50 * i}/ 500000 | lm loss: 2.3", policy=P)
        st, _ = prog(st, t, 50 * i, policy=P)
        t += 60.0
    last = t - 60.0
    st, decs = hb(st, last + 119.0, last, policy=P)
    assert decs == []  # silent twice the interval: still no hang
    at, decs = first_hang(st, last + 119.0, last + 700)
    assert [d.kind for d in decs] == ["hang"]
    assert at - last >= 2 * 60.0
    assert decs[0].evidence["window"]["learned_from"] == "progress steps"


def test_output_gaps_win_once_learned() -> None:
    st = start(policy=P)
    t = 101.0
    for step in range(40):  # a line every 2 s, a step every 2 s
        st = out(st, t, text=f"step {step}", policy=P)
        st, _ = prog(st, t, step, policy=P)
        t += 2.0
    _, decs = first_hang(st, t - 2.0, t + 700)
    assert decs and decs[0].evidence["window"]["learned_from"] == "output gaps"


def test_a_bar_restarting_each_epoch_counts_one_step_per_restart() -> None:
    st = start(policy=P)
    st, _ = bar(st, 101.0, [50, 60])
    st, _ = bar(st, 103.0, [0])  # epoch 2's bar starts at 0
    n = st.hists[STEPS_HIST].n
    st, _ = bar(st, 104.0, [1])  # the restart's gap becomes a sample once the bar moves on
    assert st.hists[STEPS_HIST].n == n + 1


def test_ceiling_evidence_says_why_nothing_was_learned() -> None:
    st = start(policy=P)
    st, last = bar(st, 101.0, [1, 2, 3])
    _, decs = first_hang(st, last, last + 700)
    w = decs[0].evidence["window"]
    assert w["basis"] == "ceiling" and w["samples"] == {"progress steps": 1}
    assert w["min_samples"] == MIN_SAMPLES
    assert describe_basis(w) == "ceiling: nothing learned yet"


def test_a_gap_that_no_step_follows_is_no_sample() -> None:
    """A stalled bar redrawn once (tqdm's monitor thread, ~19 s later) must not teach the
    window a 19 s gap: gaps become samples only when the job advances again."""
    st = start(policy=P)
    t = 101.0
    for step in range(1, 40):
        st = out(st, t, text=f"{step}/60 [00:01<00:01, 17it/s]", policy=P)
        st, _ = prog(st, t, step, policy=P)
        t += 0.5
    before = st.hists[""].summary()
    st = out(st, t + 19.0, text="39/60 [00:20<00:01, 17it/s]", policy=P)
    st, _ = prog(st, t + 19.0, 39, policy=P)  # the same step
    assert st.hists[""].summary() == before
    st = out(st, t + 20.0, text="40/60 [00:21<00:01, 17it/s]", policy=P)
    st, _ = prog(st, t + 20.0, 40, policy=P)  # the job moved on: the gap was a real pause
    assert (st.hists[""].max() or 0) >= 19.0


def test_the_advance_out_of_step_0_is_start_up_not_cadence() -> None:
    """tqdm draws `0/60` before the first step; the first step (compilation, first
    collective) can take 20 s on a loaded machine: that gap teaches nothing."""
    st = start(policy=P)
    st, last = bar(st, 101.0, [0])
    st, last = bar(st, 121.0, [5, 12, 19, 25])
    at, decs = first_hang(st, last, last + 700)
    assert decs and decs[0].evidence["window"]["learned"]["max_s"] < 2.0
    assert at - last <= 31.0


def test_a_stalled_bar_redrawn_one_step_further_teaches_nothing() -> None:
    """tqdm's monitor may redraw a stalled bar showing the step it had not drawn yet: that
    advance ends a 19 s gap no further advance confirms, so it is no sample."""
    st = start(policy=P)
    st, last = bar(st, 101.0, [1, 8, 17, 23])
    before = st.hists[STEPS_HIST].summary()
    st, _ = bar(st, last + 19.0, [25])
    assert st.hists[STEPS_HIST].summary()["max_s"] == before["max_s"]
    at, decs = first_hang(st, last + 19.0, last + 700)
    assert decs and at - (last + 19.0) <= 31.0
