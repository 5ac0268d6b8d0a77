"""A job that prints one more line after its last step and then goes silent is hung, not
stalled (seen with real torchrun: 'rank 1 stuck before all_reduce' right after step 2)."""

from __future__ import annotations

from faultwatch.core.policy import Policy
from tests.unit.core.test_detectors import hb, out, prog, start

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
