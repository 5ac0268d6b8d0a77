"""A node over its line budget: its lines past the budget are counted, not matched; its
liveness still goes out; each episode is announced (gap notice) at its start and end; the
other nodes' lines are matched as ever; a backlog (event time) is no flood."""

from __future__ import annotations

import pytest

from faultwatch import wire
from faultwatch.core.events import Hit, Line, Notice, Output
from faultwatch.errors import ConfigError
from faultwatch.streams.budget import BUDGET_ENV, LineBudget, budget_from_env
from faultwatch.streams.matcher_stage import MatcherStage
from faultwatch.streams.records import InRecord
from tests.support.stages import T0, DeadLetters, live, signals_of


def record(job: str, node: str, t0: float, n: int, text: str = "hello {i}") -> InRecord:
    lines = [Line("stdout", i, t0 + i * 1e-5, text.format(i=i)) for i in range(n)]
    return InRecord("t.logs", 0, 0, f"{job}/{node}".encode(),
                    wire.encode_lines(job, 0, node, "r", lines))


def test_a_flooding_node_is_throttled_counted_and_announced_the_others_are_not() -> None:
    stage = MatcherStage(live(), DeadLetters(), budget=LineBudget(20_000, burst_s=0.5))
    sigs = []
    # 1.5 s of a node printing 200 k lines/s (100-line records), and a quiet node beside it
    # whose last record holds an error
    for k in range(3000):
        t = T0 + k * 0.0005
        batch = [record("flood", "n0", t, 100)]
        if k % 250 == 0:
            quiet = "RuntimeError: CUDA error: an illegal memory access was encountered" \
                if k == 2750 else "step {i} ok"
            batch.append(record("calm", "n1", t, 1 if k == 2750 else 2, quiet))
        sigs += signals_of(stage.process_batch(batch, t))
    flood = [s for s in sigs if s.job == "flood"]
    calm = [s for s in sigs if s.job == "calm"]
    thrown = stage.metrics.counted("lines_throttled")
    assert 240_000 < thrown < 275_000  # matched: the burst (10 k) and 20 k/s (30 k)
    outs = [s for s in flood if isinstance(s, Output)]
    assert len(outs) == 3000 and sum(o.count for o in outs) == 300_000  # liveness: every one
    notes = [s for s in flood if isinstance(s, Notice)]
    assert [(n.kind, n.data["throttled"]) for n in notes] == [("gap", True)]
    assert stage.metrics.counted("nodes_throttled") == 1
    # the calm node: every record matched, its error hit found (positive control)
    assert [s.match.rule for s in calm if isinstance(s, Hit)] == ["cuda-illegal-memory-access"]
    assert sum(isinstance(s, Output) and s.tail != () for s in calm) == 12
    # the flood stops for a while; its next record ends the episode, with the total
    end = signals_of(stage.process_batch([record("flood", "n0", T0 + 10, 100)], T0 + 10))
    ended = [s for s in end if isinstance(s, Notice)]
    assert len(ended) == 1 and ended[0].data["throttled"] is False
    assert ended[0].data["dropped_lines"] == thrown
    assert any(isinstance(s, Output) and s.tail for s in end)  # matched again


def test_a_backlog_read_fast_is_no_flood() -> None:
    """Records of a node that printed at 1 k lines/s, all read in one processing instant."""
    stage = MatcherStage(live(), DeadLetters(), budget=LineBudget(20_000, burst_s=1.0))
    recs = [record("j", "n0", T0 + k * 0.1, 100) for k in range(2000)]
    for i in range(0, 2000, 500):
        stage.process_batch(recs[i:i + 500], T0)
    assert stage.metrics.counted("lines_throttled") == 0
    flood = LineBudget(20_000, burst_s=1.0)  # positive control: the same lines 100x denser
    assert not all(flood.take(("j", "n0"), 100, T0 + k * 0.001)[0] for k in range(2000))


def test_no_budget_and_the_setting(monkeypatch: pytest.MonkeyPatch) -> None:
    assert all(LineBudget(0).take(("j", "n"), 10**6, T0)[0] for _ in range(10))
    monkeypatch.setenv(BUDGET_ENV, "0")
    assert budget_from_env() == 0
    monkeypatch.delenv(BUDGET_ENV)
    assert budget_from_env() == 20_000
    for bad in ("lots", "-1", "inf", "nan"):
        monkeypatch.setenv(BUDGET_ENV, bad)
        with pytest.raises(ConfigError):
            budget_from_env()
