"""Bounded job state (issue 29 item 3): idle states leave the cache and come back from the
store with their budgets; decided and done jobs leave the store after finished_ttl_s; a cap
on active jobs refuses new ones; an idle one-record job costs well under 2 kB (a small
bench/idle_jobs.py)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

from faultwatch import wire
from faultwatch.core.events import Exit, Heartbeat, Line, RunStart
from faultwatch.core.policy import Policy
from faultwatch.errors import ConfigError
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


def _tick_until(pipe: LocalPipeline, t: float, end: float) -> float:
    while t < end:
        pipe.tick(t)
        t += 1.0
    return t


def test_decided_and_done_jobs_leave_the_store_after_their_ttl() -> None:
    ttl = 300.0
    pipe = LocalPipeline(builtin_ruleset(),
                         Policy(settle_s=0.5, max_restarts=5, node_lost_detection=False))
    pipe.jobs.finished_ttl_s = ttl
    assert _fail(pipe, "decided", 0, T0) == ["restart:1"]  # waits for its relaunch
    assert _fail(pipe, "late", 0, T0) == ["restart:1"]
    for job, code in (("done", 0), ("live", None)):
        key = wire.log_key(job, "n0")
        pipe.submit(key, wire.encode_run_start(RunStart(job, 0, "n0", T0, run_id="r")), T0)
        if code is not None:
            pipe.submit(key, wire.encode_exit(Exit(job, 0, "n0", T0 + 1, code, run_id="r")),
                        T0 + 1)
    store = pipe.store.data
    t = _tick_until(pipe, T0 + 10, T0 + 60)
    # a record of the decided attempt arrives late: the job changed, its TTL starts again
    late_at = t
    hb = Heartbeat("late", 0, "n0", late_at, True, late_at, T0)
    pipe.submit(wire.log_key("late", "n0"), wire.encode_heartbeat(hb, "r"), late_at)
    t = _tick_until(pipe, t, T0 + ttl - 10)
    assert {b"decided", b"done", b"late", b"live"} <= set(store)  # nothing before the TTL
    t = _tick_until(pipe, t, T0 + ttl + 20)
    assert b"decided" not in store and b"done" not in store
    assert b"late" in store and b"live" in store  # changed later / still running
    assert pipe.metrics.extra["jobs_expired"] == 2
    t = _tick_until(pipe, t, late_at + ttl + 20)
    assert b"late" not in store and b"live" in store
    p = pipe.jobs.parts[0]
    assert not ({b"decided", b"done", b"late"} & (set(p.cache) | set(p.finished)))
    # a job that returns after its TTL starts afresh: its restart budget too (documented)
    assert _fail(pipe, "decided", 1, t) == ["restart:1"]


def test_finished_jobs_found_after_a_rebalance_expire_too() -> None:
    pipe = LocalPipeline(builtin_ruleset(), Policy(settle_s=0.5, node_lost_detection=False))
    pipe.jobs.finished_ttl_s = 100.0
    key = wire.log_key("done", "n0")
    pipe.submit(key, wire.encode_run_start(RunStart("done", 0, "n0", T0, run_id="r")), T0)
    pipe.submit(key, wire.encode_exit(Exit("done", 0, "n0", T0 + 1, 0, run_id="r")), T0 + 1)
    pipe.jobs.on_assigned([0])  # the caches go; the store (the table) stays
    t = _tick_until(pipe, T0 + 2, T0 + 50)
    assert b"done" in pipe.store.data  # the TTL counts from this worker's first sight
    _tick_until(pipe, t, T0 + 2 + 100 + 10)
    assert b"done" not in pipe.store.data


def test_the_cap_refuses_new_jobs_and_counts_them() -> None:
    """Jobs that report (a heartbeat each): at the cap a new one is refused (a table of jobs
    that showed nothing makes room instead: tests/unit/streams/test_job_table.py)."""
    pipe = LocalPipeline(builtin_ruleset(), Policy())
    pipe.jobs.max_jobs = 3
    for i in range(5):
        job = f"c{i}"
        pipe.submit(wire.log_key(job, "n0"), wire.encode_run_start(RunStart(job, 0, "n0", T0)),
                    T0)
        pipe.submit(wire.log_key(job, "n0"), wire.encode_heartbeat(
            Heartbeat(job, 0, "n0", T0, True, T0, T0)), T0)
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


@pytest.mark.parametrize("raw", ["abc", "0", "-5", "nan", "inf"])
def test_a_bad_finished_ttl_is_a_config_error(raw: str, monkeypatch: pytest.MonkeyPatch) -> None:
    from faultwatch.core.policy import Policy
    from faultwatch.rules import RuleSet
    from faultwatch.streams.faust_app import ProcessorConfig

    monkeypatch.setenv("FAULTWATCH_FINISHED_TTL_S", raw)
    with pytest.raises(ConfigError, match="FAULTWATCH_FINISHED_TTL_S"):
        ProcessorConfig(bootstrap="b:1", ruleset=RuleSet(()), policy=Policy())
    monkeypatch.setenv("FAULTWATCH_FINISHED_TTL_S", "3600")  # the positive control
    cfg = ProcessorConfig(bootstrap="b:1", ruleset=RuleSet(()), policy=Policy())
    assert cfg.finished_ttl_s == 3600.0
