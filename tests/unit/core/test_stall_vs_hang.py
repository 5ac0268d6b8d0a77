"""A job that prints one more line after its last step and then goes silent is hung, not
stalled (seen with real torchrun: 'rank 1 stuck before all_reduce' right after step 2)."""

from __future__ import annotations

from faultwatch.core.policy import Policy
from tests.support.job_events import hb, out, prog, start

P = Policy(hang_window_s=5, settle_s=0, max_restarts=3)


def test_trailing_line_then_silence_is_a_hang() -> None:
    st = start(policy=P)
    t = 100.0
    for step in range(6):  # steps every 0.2 s, past warm-up
        t += 0.2
        st = out(st, t, text=f"step {step} loss 0.1")
        st, _ = prog(st, t, step, policy=P)
    st = out(st, t + 0.01, rank=1, text="rank 1 stuck before all_reduce")
    decisions = []
    now = t
    while not decisions and now < t + 20:
        now += 0.5
        st, decisions = hb(st, now, t + 0.01, policy=P)
    assert [d.kind for d in decisions] == ["hang"]


def test_silence_right_after_a_root_error_waits_for_the_exit() -> None:
    """torchrun is silent for seconds after a rank raised while it stops the others: that is
    teardown, not a hang (seen: a progress-stall restart before the error's own decision).
    Past the grace a job that printed an error and then hangs is hung (positive control)."""
    from faultwatch.core.events import Exit
    from faultwatch.core.job import apply
    from faultwatch.core.silence import ERROR_EXIT_GRACE_S
    from tests.support.job_events import hit

    st = start(policy=P)
    t = 100.0
    for step in range(6):
        t += 0.2
        st = out(st, t, text=f"step {step}")
        st, _ = prog(st, t, step, policy=P)
    st, _ = apply(st, hit("c10d-socket-timeout", "retryable", t + 0.1), t + 0.1, P)
    decisions = []
    now = t
    while now < t + 10:  # twice the 5 s window: no hang while the process tears down
        now += 0.5
        st, decisions = hb(st, now, t + 0.1, policy=P)
        assert decisions == [], decisions
    st, decisions = apply(st, Exit("j", 0, "n0", now + 0.5, 1), now + 0.5, P)
    assert [(d.kind, d.action) for d in decisions] == [("error", "restart")]
    # positive control: an error line, then a hang that outlasts the grace
    st2 = start(policy=P)
    st2 = out(st2, 100.0, text="step 0")
    st2, _ = apply(st2, hit("nccl-warn", "retryable", 100.1), 100.1, P)
    now, decisions = 100.1, []
    while not decisions and now < 100.1 + ERROR_EXIT_GRACE_S + 10:
        now += 1.0
        st2, decisions = hb(st2, now, 100.1, policy=P)
    assert [d.kind for d in decisions] == ["hang"]
    assert now >= 100.1 + ERROR_EXIT_GRACE_S


def test_a_stalled_bar_redrawn_once_is_a_hang_not_a_stall() -> None:
    """tqdm's monitor thread refreshes a stalled bar once (same counter, new elapsed time)
    ~10-20 s after the last step: one redraw is not output flowing."""
    p = Policy(hang_floor_s=10, settle_s=0, diagnose=False)
    st = start(policy=p)
    t = 100.0
    for step in range(1, 40):
        t += 0.5
        st = out(st, t, text=f" 42%|####  | {step}/60 [00:0{step // 10}<00:01, 17it/s]", policy=p)
        st, _ = prog(st, t, step, policy=p)
    last_step = t
    st = out(st, t + 8.0, text=" 42%|####  | 39/60 [00:19<00:01, 17it/s]", policy=p)
    st, _ = prog(st, t + 8.0, 39, policy=p)
    decisions: list = []
    now = t + 8.0
    while not decisions and now < t + 60:
        now += 0.5
        st, decisions = hb(st, now, t + 8.0, policy=p)
    assert [d.kind for d in decisions] == ["hang"], decisions
    assert now - last_step >= 18.0
