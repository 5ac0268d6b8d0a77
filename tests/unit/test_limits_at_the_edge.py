"""The time limits outside the core at exactly their edge (time passed in): the replay rule's
maximum age and future skew, the actuator's drain window and share, the notifier's rate limit
and digest interval. Just below, exactly at, just above; "at" is binary-exact."""

from __future__ import annotations

import pytest

from faultwatch.actuate.limits import ActuateLimits, DrainLimiter
from faultwatch.notify.grouping import Notification
from faultwatch.notify.limit import Limiter, RateLimits
from faultwatch.trust.replay import FROM_FUTURE, MAX_FUTURE_S, TOO_OLD, ReplayGuard

Q = 0.25
EDGE = pytest.mark.parametrize("d", [-Q, 0.0, Q], ids=["below", "at", "above"])
NOW = 10_000.0


@EDGE
def test_replay_max_age(d: float) -> None:
    """A decision exactly max_age_s old may still act; older is refused."""
    got = ReplayGuard("decision", 600.0).check("d1", NOW - 600 - d, NOW)
    assert got == (TOO_OLD if d > 0 else None)


@EDGE
def test_replay_future_skew(d: float) -> None:
    """A decision stamped up to MAX_FUTURE_S ahead (clock skew) may act; further is refused."""
    got = ReplayGuard("decision", 600.0).check("d1", NOW + MAX_FUTURE_S + d, NOW)
    assert got == (FROM_FUTURE if d > 0 else None)


@EDGE
def test_drain_window(d: float) -> None:
    """A drain exactly window_s ago has left the rate window."""
    lim = DrainLimiter(ActuateLimits(max_drains_per_window=1, window_s=600,
                                     max_drained_share=1))
    lim.drained("a", NOW)
    assert (lim.why_not("b", 100, NOW + 600 + d) is None) == (d >= 0)


@pytest.mark.parametrize("drains, allowed", [(1, True), (2, False)])
def test_drains_per_window(drains: int, allowed: bool) -> None:
    lim = DrainLimiter(ActuateLimits(max_drains_per_window=2, window_s=600,
                                     max_drained_share=1))
    for i in range(drains):
        lim.drained(f"n{i}", NOW)
    assert (lim.why_not("x", 100, NOW + 1) is None) == allowed


@pytest.mark.parametrize("drained, allowed", [(3, True), (4, False)])
def test_drained_share(drained: int, allowed: bool) -> None:
    """At most max_drained_share of the known nodes (0.1 of 40: 4) drained at once."""
    lim = DrainLimiter(ActuateLimits(max_drains_per_window=100, window_s=600,
                                     max_drained_share=0.1, min_drained_nodes=1))
    for i in range(drained):
        lim.drained(f"n{i}", NOW)
    assert (lim.why_not("x", 40, NOW + 1) is None) == allowed


def _note(i: int) -> Notification:
    d = {"id": f"j/{i}", "job": "j", "action": "restart", "attempt": 0,
         "reason": {"kind": "error", "message": "boom"}, "targets": {"nodes": ["n1"]}, "ts": 0}
    return Notification(labels={"job": "j", "kind": "error"}, reason="initial", decisions=(d,),
                        new_ids=frozenset({f"j/{i}"}), firing=1, total=1, first_ts=0.0,
                        now=0.0)


@EDGE
def test_webhook_rate_limit_refills_one_post_per_interval(d: float) -> None:
    """60 a minute: a burst of 60, then the next post exactly one second later."""
    lim = Limiter(RateLimits(per_webhook_per_min=60, total_per_min=6000), NOW)
    assert all(lim.admit("h", _note(i), NOW) for i in range(60))
    assert not lim.admit("h", _note(60), NOW)
    assert lim.admit("h", _note(61), NOW + 1 + d) is (d >= 0)


@EDGE
def test_digest_interval(d: float) -> None:
    """What the limit held back goes out as a digest digest_interval_s after the first."""
    lim = Limiter(RateLimits(per_webhook_per_min=1, total_per_min=6000, digest_interval_s=60),
                  NOW)
    assert lim.admit("h", _note(0), NOW)
    assert not lim.admit("h", _note(1), NOW)  # held: the digest starts now
    assert (len(lim.due_digests(NOW + 60 + d)) == 1) == (d >= 0)
