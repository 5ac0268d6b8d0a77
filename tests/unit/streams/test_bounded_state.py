"""Bounded job state (issue 29 item 3): idle states leave the cache and come back from the
store with their budgets; a cap on active jobs refuses new ones; an idle one-record job
costs well under 2 kB (a small bench/idle_jobs.py)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

from faultwatch import wire
from faultwatch.core.events import Exit, Line, RunStart
from faultwatch.core.policy import Policy
from faultwatch.streams.job_stage import JOB_IDLE_S
from faultwatch.streams.local import LocalPipeline
from tests.support.rules import builtin_ruleset

T0 = 1_700_000_000.0
RETRYABLE = "RuntimeError: Socket Timeout"


def _fail(pipe: LocalPipeline, job: str, attempt: int, t: float) -> list[str]:
    key = wire.log_key(job, "n0")
    out = []
    for v in (wire.encode_run_start(RunStart(job, attempt, "n0", t, run_id="r")),
              wire.encode_lines(job, attempt, "n0", "r", [Line("stderr", 0, t, RETRYABLE)]),
              wire.encode_exit(Exit(job, attempt, "n0", t + 0.1, 1, run_id="r"))):
        out += [f"{d.action}:{d.budgets.get('restarts_used')}" for d in pipe.submit(key, v, t)]
    for i in range(1, 10):
        out += [f"{d.action}:{d.budgets.get('restarts_used')}" for d in pipe.tick(t + i)]
    return out


def test_an_idle_state_leaves_the_cache_and_returns_with_its_budget() -> None:
    pipe = LocalPipeline(builtin_ruleset(), Policy(settle_s=0.5, max_restarts=5))
    assert _fail(pipe, "j", 0, T0) == ["restart:1"]
    p = pipe.jobs.parts[0]
    assert b"j" in p.cache
    t = T0 + 10
    while t < T0 + 10 + JOB_IDLE_S + 10:
        pipe.tick(t)
        t += 0.5
    assert b"j" not in p.cache and b"j" in pipe.store.data  # encoded only
    assert pipe.metrics.extra["jobs_evicted"] >= 1
    # the job returns (its next attempt): decoded from the store, the budget goes on
    assert _fail(pipe, "j", 1, t) == ["restart:2"]


def test_the_cap_refuses_new_jobs_and_counts_them() -> None:
    pipe = LocalPipeline(builtin_ruleset(), Policy())
    pipe.jobs.max_jobs = 3
    for i in range(5):
        job = f"c{i}"
        pipe.submit(wire.log_key(job, "n0"), wire.encode_run_start(RunStart(job, 0, "n0", T0)),
                    T0)
    assert sorted(pipe.jobs.parts[0].active) == [b"c0", b"c1", b"c2"]
    assert pipe.metrics.extra["jobs_refused"] == 2
    # an active job that ends makes room (positive control of the refusal)
    pipe.submit(wire.log_key("c0", "n0"), wire.encode_exit(Exit("c0", 0, "n0", T0 + 1, 0)),
                T0 + 1)
    pipe.submit(wire.log_key("c9", "n0"), wire.encode_run_start(RunStart("c9", 0, "n0", T0)),
                T0 + 2)
    assert b"c9" in pipe.jobs.parts[0].active


def test_idle_one_record_jobs_cost_under_2_kB_each_and_no_mass_restart() -> None:
    path = Path(__file__).resolve().parents[3] / "bench" / "idle_jobs.py"
    spec = importlib.util.spec_from_file_location("idle_jobs", path)
    assert spec is not None and spec.loader is not None
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    got = bench.run(jobs=600, partitions=4, run_s=150.0)
    print(got)
    assert got["jobs_cached_idle"] == 0
    assert got["idle_bytes_per_job"] < 2000, got
    assert got["cached_bytes_per_job"] > got["idle_bytes_per_job"]  # the eviction did it
    assert got["decisions"] == {"notify:fleet-storm": 1}, got
