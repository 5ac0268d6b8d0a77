"""Policy values outside their documented ranges are refused at load, in rules check and push."""

from __future__ import annotations

from pathlib import Path

import pytest

from faultwatch.core.policy import KNOBS, POLICY_RANGES, Policy
from faultwatch.errors import ConfigError
from faultwatch.rules.merging import merge_texts


@pytest.mark.parametrize("key,value", [("node_lost_s", 0.01), ("max_restarts", 10**9),
                                       ("blacklist_s", 1e10), ("settle_s", 1e6),
                                       ("hang_window_s", 0.001)])
def test_out_of_range_values_are_refused_at_load(key: str, value: float) -> None:
    with pytest.raises(ConfigError, match=key):
        Policy().with_overrides({key: value})


def test_the_defaults_and_the_range_ends_are_accepted() -> None:
    p = Policy()
    for key, (lo, hi) in POLICY_RANGES.items():
        if key in ("hang_floor_s", "hang_ceiling_s", "fleet_storm_window_s",
                   "fleet_storm_hold_max_s"):
            continue  # bound to each other (floor <= ceiling, window <= hold)
        cur = getattr(p, key)
        kind = int if isinstance(cur, int) and not isinstance(cur, bool) else float
        is_open = KNOBS[key].open
        ends = [v for v, side in ((lo, "lo"), (hi, "hi")) if is_open not in (side, "both")]
        for v in ends:
            Policy().with_overrides({key: kind(v)})


def test_rule_files_name_path_and_line(tmp_path: Path) -> None:
    text = "version: 1\npolicy:\n  node_lost_s: 0.01\n  max_restarts: 1000000000\n" \
           "  blacklist_s: 1.0e+10\n  settle_s: 1\n"
    _rs, problems = merge_texts([("site.yaml", text)], builtin=False)
    got = sorted(str(p) for p in problems)
    assert any(g.startswith("site.yaml:3: policy.node_lost_s must be in [1, 86400]")
               for g in got), got
    assert any(g.startswith("site.yaml:4: policy.max_restarts") for g in got), got
    assert any(g.startswith("site.yaml:5: policy.blacklist_s") for g in got), got
    assert len(got) == 3, got
