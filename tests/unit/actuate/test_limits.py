"""The drain limits: a rate per window and a share of the known nodes (pure)."""

from __future__ import annotations

import pytest

from faultwatch.actuate.limits import ActuateLimits, DrainLimiter


def test_the_rate_limit_counts_drains_in_the_window() -> None:
    lim = DrainLimiter(ActuateLimits(max_drains_per_window=3, window_s=60, max_drained_share=1))
    for i in range(3):
        assert lim.why_not(f"n{i}", 100, 0.0) is None
        lim.drained(f"n{i}", 0.0)
    assert "3 drains in the last 60 s" in (lim.why_not("n9", 100, 1.0) or "")
    assert lim.why_not("n0", 100, 1.0) is None  # already drained: nothing more taken
    assert lim.why_not("n9", 100, 60.5) is None  # the window moved on


def test_the_share_limit_counts_drained_nodes_but_allows_one() -> None:
    lim = DrainLimiter(ActuateLimits(max_drains_per_window=100, max_drained_share=0.1))
    for i in range(10):
        assert lim.why_not(f"n{i}", 100, 0.0) is None
        lim.drained(f"n{i}", 0.0)
    assert "10 of 100 known nodes drained" in (lim.why_not("n10", 100, 0.0) or "")
    lim.resumed("n3")
    assert lim.why_not("n10", 100, 0.0) is None
    small = DrainLimiter(ActuateLimits())  # a small fleet still loses its few bad nodes
    for n in ("a", "b", "c"):
        assert small.why_not(n, 3, 0.0) is None
        small.drained(n, 0.0)
    assert small.why_not("d", 4, 0.0) is not None


@pytest.mark.parametrize("bad", [{"max_drains_per_window": 0}, {"window_s": 0},
                                 {"max_drained_share": 0}, {"max_drained_share": 1.5}])
def test_bad_limits_are_refused(bad: dict[str, float]) -> None:
    with pytest.raises(ValueError):
        ActuateLimits(**bad)  # type: ignore[arg-type]
