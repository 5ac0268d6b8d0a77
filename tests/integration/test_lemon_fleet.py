"""Lemon nodes in a simulated fleet, in process (bench/lemon_fleet.py: the embedded pipeline's
matcher and job stages, incident publisher and lemon feed, simulated time): jobs of two nodes
each, one node that silently fails one job in three, healthy nodes failing at a background
rate. The lemon is named, no healthy node is, nothing is quarantined by default; with
`lemon_action: quarantine` the registry quarantines the lemon and only it."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from faultwatch.core.lemons import LEMON_KIND
from faultwatch.core.policy import Policy
from faultwatch.core.registry import QUARANTINED


def bench() -> ModuleType:
    path = Path(__file__).resolve().parents[2] / "bench" / "lemon_fleet.py"
    spec = importlib.util.spec_from_file_location("lemon_fleet", path)
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod  # its dataclasses look their module up there
    spec.loader.exec_module(mod)
    return mod


pytestmark = pytest.mark.slow  # ~15 s each on 2 cores (300 jobs, simulated time)

B = bench()


def lemon_notices(f: Any) -> list[Any]:
    return [d for d in f.pipeline.lemon_decisions if d.kind == LEMON_KIND]


def test_the_lemon_is_named_no_healthy_node_is_nothing_quarantined() -> None:
    f = B.simulate(Policy(settle_s=1.0))
    print(f"\n{B.JOBS} jobs: the lemon ran {f.lemon_jobs}, failed {f.lemon_failures}; "
          f"{f.background_failures} background failures")
    assert f.lemon_failures >= 3 and f.background_failures >= 1  # the fleet has both
    failures = [d for d in f.decisions if getattr(d, "action", "") in ("fail", "restart")]
    assert len(failures) == f.lemon_failures + f.background_failures
    (notice,) = lemon_notices(f)
    assert notice.nodes == (B.LEMON,) and notice.action == "notify"
    assert len(notice.evidence["jobs"]) >= 3
    assert f.pipeline.nodes.quarantined(B.LEMON, B.T0 + B.JOBS * 10.0) is None
    assert all(r.state != QUARANTINED for r in f.pipeline.nodes.registry.values())


def test_with_the_quarantine_policy_the_registry_quarantines_the_lemon_only() -> None:
    f = B.simulate(Policy(settle_s=1.0, lemon_action="quarantine"))
    (notice,) = lemon_notices(f)
    assert notice.action == "blacklist" and notice.nodes == (B.LEMON,)
    now = notice.ts + 1.0
    assert f.pipeline.nodes.quarantined(B.LEMON, now) is not None
    assert [n for n in B.NODES if f.pipeline.nodes.quarantined(n, now)] == [B.LEMON]
