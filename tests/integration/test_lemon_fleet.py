"""Lemon nodes in a simulated fleet, in process (the embedded pipeline: the matcher and job
stages, the incident publisher and the lemon feed of a processor, simulated time): jobs of two
nodes each, one node that silently fails one job in three, healthy nodes failing at a
background rate. The lemon is named, no healthy node is, nothing is quarantined by default;
with `lemon_action: quarantine` the registry quarantines the lemon and only it."""

from __future__ import annotations

import functools
import random
from dataclasses import dataclass

from faultwatch import wire
from faultwatch.core.events import Exit, Heartbeat, Line, RunStart
from faultwatch.core.lemons import LEMON_KIND
from faultwatch.core.policy import Policy
from faultwatch.core.registry import QUARANTINED
from faultwatch.rules import Matcher, RuleSet, load_ruleset
from faultwatch.streams.local import LocalPipeline

T0 = 1_700_000_000.0
NODES = [f"n{k:02d}" for k in range(24)]
LEMON = "n07"
JOBS = 300
BACKGROUND = 0.01  # a healthy job fails on one of its nodes with this chance
JOB_S = 60.0


@dataclass
class Fleet:
    lemon_jobs: int
    lemon_failures: int
    background_failures: int
    decisions: list[object]
    pipeline: LocalPipeline


@functools.cache
def rules() -> tuple[RuleSet, Matcher]:
    rs = load_ruleset(())
    return rs, Matcher(rs)


def simulate(policy: Policy, seed: int = 7) -> Fleet:
    rng = random.Random(seed)
    rs, matcher = rules()
    p = LocalPipeline(rs, policy, node_lost=False, matcher=lambda _rs: matcher)
    lemon_jobs = lemon_failures = background = 0
    decs: list[object] = []
    for k in range(JOBS):
        job, run = f"job-{k:03d}", f"run-{k:03d}"
        nodes = rng.sample(NODES, 2)
        t = T0 + k * 10.0  # a job starts every 10 s: six run at once
        failing = None
        if LEMON in nodes:
            lemon_jobs += 1
            if rng.random() < 1 / 3:
                failing, lemon_failures = LEMON, lemon_failures + 1
        if failing is None and rng.random() < BACKGROUND:
            failing, background = rng.choice(nodes), background + 1
        for n in nodes:
            decs += p.submit(wire.log_key(job, n), wire.encode_run_start(
                RunStart(job, 0, n, t, run_id=run, run_source="flag", nnodes=2)), t)
        for step in range(1, 7):  # a line a node every 5 s, heartbeats
            ts = t + 5.0 * step
            for n in nodes:
                if n == failing and step > 3:
                    continue
                decs += p.submit(wire.log_key(job, n), wire.encode_lines(
                    job, 0, n, run, [Line("stdout", step, ts, f"step {step} loss 0.5")]), ts)
                decs += p.submit(wire.log_key(job, n), wire.encode_heartbeat(
                    Heartbeat(job, 0, n, ts, True, ts), run), ts)
            if failing is not None and step == 3:  # dies silently: no error line at all
                decs += p.submit(wire.log_key(job, failing), wire.encode_exit(
                    Exit(job, 0, failing, ts + 1.0, 1), run), ts + 1.0)
                decs += p.tick(ts + 1.0 + policy.settle_s + 0.5)
        end = t + JOB_S
        for n in nodes:
            if n != failing:
                decs += p.submit(wire.log_key(job, n), wire.encode_exit(
                    Exit(job, 0, n, end, 0 if failing is None else 143), run), end)
        decs += p.tick(end)
        p.ledgers(end)
    return Fleet(lemon_jobs, lemon_failures, background, decs, p)


def lemon_notices(f: Fleet) -> list[object]:
    return [d for d in f.pipeline.lemon_decisions if d.kind == LEMON_KIND]


def test_the_lemon_is_named_no_healthy_node_is_nothing_quarantined() -> None:
    f = simulate(Policy(settle_s=1.0))
    print(f"\n{JOBS} jobs: the lemon ran {f.lemon_jobs}, failed {f.lemon_failures}; "
          f"{f.background_failures} background failures")
    assert f.lemon_failures >= 3 and f.background_failures >= 1  # the fleet has both
    failures = [d for d in f.decisions if getattr(d, "action", "") in ("fail", "restart")]
    assert len(failures) == f.lemon_failures + f.background_failures
    (notice,) = lemon_notices(f)
    assert notice.nodes == (LEMON,) and notice.action == "notify"
    assert len(notice.evidence["jobs"]) >= 3
    assert f.pipeline.nodes.quarantined(LEMON, T0 + JOBS * 10.0) is None
    assert all(r.state != QUARANTINED for r in f.pipeline.nodes.registry.values())


def test_with_the_quarantine_policy_the_registry_quarantines_the_lemon_only() -> None:
    f = simulate(Policy(settle_s=1.0, lemon_action="quarantine"))
    (notice,) = lemon_notices(f)
    assert notice.action == "blacklist" and notice.nodes == (LEMON,)
    now = notice.ts + 1.0
    assert f.pipeline.nodes.quarantined(LEMON, now) is not None
    assert [n for n in NODES if f.pipeline.nodes.quarantined(n, now)] == [LEMON]
