"""Lemon nodes in a simulated fleet, in process (issue 39 item 3): the embedded pipeline's
matcher and job stages, incident publisher and lemon feed on simulated time; --jobs jobs of two
nodes each over 24 nodes, one node (n07) silently failing one job in three, healthy nodes
failing at --background a job. Prints one JSON object: per seed, the nodes named lemon, the
lemon's runs and failures, the background failures; over the seeds, how often the lemon was
named (recall) and how many healthy nodes were (false lemons).

    .venv/bin/python bench/lemon_fleet.py --seeds 10
"""

from __future__ import annotations

import argparse
import functools
import json
import random
import sys
import time
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from faultwatch import wire  # noqa: E402
from faultwatch.core.events import Exit, Heartbeat, Line, RunStart  # noqa: E402
from faultwatch.core.lemons import LEMON_KIND  # noqa: E402
from faultwatch.core.policy import Policy  # noqa: E402
from faultwatch.rules import Matcher, RuleSet, load_ruleset  # noqa: E402
from faultwatch.streams.local import LocalPipeline  # noqa: E402

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


def simulate(policy: Policy, seed: int = 7, jobs: int = JOBS,
             background: float = BACKGROUND) -> Fleet:
    rng = random.Random(seed)
    rs, matcher = rules()
    p = LocalPipeline(rs, policy, node_lost=False, matcher=lambda _rs: matcher)
    lemon_jobs = lemon_failures = bg = 0
    decs: list[object] = []
    for k in range(jobs):
        job, run = f"job-{k:03d}", f"run-{k:03d}"
        nodes = rng.sample(NODES, 2)
        t = T0 + k * 10.0  # a job starts every 10 s: six run at once
        failing = None
        if LEMON in nodes:
            lemon_jobs += 1
            if rng.random() < 1 / 3:
                failing, lemon_failures = LEMON, lemon_failures + 1
        if failing is None and rng.random() < background:
            failing, bg = rng.choice(nodes), bg + 1
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
    return Fleet(lemon_jobs, lemon_failures, bg, decs, p)


def lemons_named(f: Fleet) -> list[str]:
    return sorted({n for d in f.pipeline.lemon_decisions if d.kind == LEMON_KIND
                   for n in d.nodes})


def main() -> None:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--seeds", type=int, default=10)
    ap.add_argument("--jobs", type=int, default=JOBS)
    ap.add_argument("--background", type=float, default=BACKGROUND)
    a = ap.parse_args()
    out = []
    t = time.perf_counter()
    for seed in range(1, a.seeds + 1):
        f = simulate(Policy(settle_s=1.0), seed, a.jobs, a.background)
        out.append({"seed": seed, "named": lemons_named(f), "lemon_jobs": f.lemon_jobs,
                    "lemon_failures": f.lemon_failures,
                    "background_failures": f.background_failures})
    print(json.dumps({
        "nodes": len(NODES), "jobs": a.jobs, "background": a.background, "lemon": LEMON,
        "recall": sum(LEMON in r["named"] for r in out) / len(out),
        "false_lemons": sum(len([n for n in r["named"] if n != LEMON]) for r in out),
        "seconds": round(time.perf_counter() - t, 1), "runs": out}))


if __name__ == "__main__":
    main()
