"""Memory per idle job in the job stage (issue 29 item 3, issue 35 item 7): --jobs jobs each
send ONE run-start record and nothing else (each from a node of its own, or with --one-node
all from one: the phantom flood of issue 35); processor time then runs on (ticks every
0.5 s) past the node-lost window and the idle time. Prints one JSON object: Python heap per
job while the states are cached and once they are idle (tracemalloc, the store's encoded
states included), RSS, the longest tick, and the decisions made (with the blast-radius
guard: one notice, no mass restart), and the posts one webhook of `faultwatch notify`
would get for them (its grouping and rate-limit cores with
their defaults, on processor time: `notify_posts`).

    .venv/bin/python bench/idle_jobs.py --jobs 10000
    .venv/bin/python bench/idle_jobs.py --jobs 10000 --rss-only --no-guard   # the peer

The store is the job stage's DictStore: the same encoded bytes per job that a processor keeps
in its Faust table (store memory://) and writes to the table's changelog topic.
"""

from __future__ import annotations

import argparse
import gc
import json
import resource
import sys
import time
import tracemalloc
from collections import Counter
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from faultwatch import wire  # noqa: E402
from faultwatch.core.events import Decision, RunStart  # noqa: E402
from faultwatch.core.policy import Policy  # noqa: E402
from faultwatch.notify.grouping import Grouper  # noqa: E402
from faultwatch.notify.limit import Limiter, RateLimits  # noqa: E402
from faultwatch.rules import Matcher, load_ruleset  # noqa: E402
from faultwatch.streams.job_stage import (  # noqa: E402
    FINISHED_TTL_S,
    TICK_S,
    DictStore,
    JobStage,
)
from faultwatch.streams.records import InRecord, LiveRules  # noqa: E402

T0 = 1_700_000_000.0


def rss_kb() -> int:
    """Current resident set size (kB) from /proc, else the peak."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss


def measure() -> tuple[int, int]:
    gc.collect()
    heap = tracemalloc.get_traced_memory()[0] if tracemalloc.is_tracing() else 0
    return heap, rss_kb()


class Posts:
    """One webhook of `faultwatch notify` with its default grouping and rate limits (the
    pure cores its service drives), fed the stage's decisions on processor time."""

    def __init__(self, now: float) -> None:
        self.grouper, self.limiter = Grouper(), Limiter(RateLimits(), now)
        self.posts = self.digests = self.digested = 0

    def add(self, d: Decision, now: float) -> None:
        self.grouper.add(wire.decision_to_dict(d), now)

    def flush(self, now: float) -> None:
        for note in self.grouper.due(now):
            if self.limiter.admit("hook", note, now):
                self.posts += 1
        for _, dg in self.limiter.due_digests(now):
            self.digests += 1
            self.digested += dg.decisions

    def result(self) -> dict[str, int]:
        return {"posts": self.posts + self.digests, "digests": self.digests,
                "decisions_in_digests": self.digested}


def run(jobs: int, partitions: int, run_s: float, trace: bool = True,
        guard: bool = True, one_node: bool = False,
        finished_ttl_s: float = FINISHED_TTL_S) -> dict[str, Any]:
    rs = load_ruleset([])
    live = LiveRules(Matcher(rs), Policy(fleet_storm_detection=guard), rs.version)
    posts = Posts(T0)
    store = DictStore()
    stage = JobStage(live, store, lambda rec, err: None, max_jobs=max(jobs, 1) * 2,
                     finished_ttl_s=finished_ttl_s)
    decisions: Counter[str] = Counter()
    if trace:
        tracemalloc.start()
    base_heap, base_rss = measure()
    t_wall = time.perf_counter()
    batch: list[InRecord] = []
    for i in range(jobs):
        job = f"idle-{i:06d}"
        part = i % partitions
        node = "n0" if one_node else f"n{i:06d}"
        value = wire.encode_bundle(job, [RunStart(job, 0, node, T0, run_id=f"r{i}",
                                                  world_size=8, rank=0)])
        batch.append(InRecord("bench.signals", part, i, wire.job_key(job), value))
        if len(batch) >= 1000:
            for d in stage.process_batch(batch, T0):
                decisions[f"{d.action}:{d.kind}"] += 1
                posts.add(d, T0)
            batch = []
    for d in stage.process_batch(batch, T0):
        decisions[f"{d.action}:{d.kind}"] += 1
        posts.add(d, T0)
    del batch, value  # the input records are the sender's, not the stage's
    for part in range(partitions):
        stage.tick(part, T0, T0)
    feed_s = time.perf_counter() - t_wall
    cached_heap, cached_rss = measure()
    now = T0
    max_tick_s = 0.0  # the longest tick: the worker's loop is held this long
    while now < T0 + run_s:
        now += TICK_S
        for part in range(partitions):
            t_tick = time.perf_counter()
            decided = stage.tick(part, now, now)
            max_tick_s = max(max_tick_s, time.perf_counter() - t_tick)
            for d in decided:
                decisions[f"{d.action}:{d.kind}"] += 1
                posts.add(d, now)
        posts.flush(now)
    idle_heap, idle_rss = measure()
    if trace:
        tracemalloc.stop()
    stored = sum(len(v) for v in store.data.values())
    return {
        "jobs": jobs, "partitions": partitions, "processor_time_s": run_s,
        "feed_s": round(feed_s, 3), "max_tick_s": round(max_tick_s, 3),
        "cached_bytes_per_job": round((cached_heap - base_heap) / max(1, jobs)),
        "idle_bytes_per_job": round((idle_heap - base_heap) / max(1, jobs)),
        "stored_bytes_per_job": round(stored / max(1, jobs)),
        "rss_bytes_per_job": {"cached": round((cached_rss - base_rss) * 1024 / max(1, jobs)),
                           "idle": round((idle_rss - base_rss) * 1024 / max(1, jobs))},
        "rss_mb": {"base": round(base_rss / 1024, 1), "cached": round(cached_rss / 1024, 1),
                   "idle": round(idle_rss / 1024, 1)},
        "jobs_cached_idle": sum(len(p.cache) for p in stage.parts.values()),
        "jobs_stored_idle": len(store.data),
        "jobs_active_idle": sum(len(p.active) for p in stage.parts.values()),
        "guard": stage.guard.state(),
        "decisions": dict(decisions),
        "notify_posts": posts.result(),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--jobs", type=int, default=10_000)
    ap.add_argument("--partitions", type=int, default=8)
    ap.add_argument("--rss-only", action="store_true",
                    help="no tracemalloc (its own bookkeeping inflates RSS): RSS figures only")
    ap.add_argument("--processor-time-s", type=float, default=150.0,
                    help="processor time simulated after the run-starts (past node-lost "
                         "and the idle time)")
    ap.add_argument("--one-node", action="store_true",
                    help="every job's run-start from one node (a phantom flood; no quota "
                         "here: the stage alone). Default: a node per job (a fleet)")
    ap.add_argument("--finished-ttl-s", type=float, default=FINISHED_TTL_S,
                    help="decided jobs leave the table after this long (below "
                         "--processor-time-s: what is left once they are gone)")
    ap.add_argument("--no-guard", action="store_true",
                    help="the blast-radius guard off (fleet_storm_detection: false): the peer")
    args = ap.parse_args()
    print(json.dumps(run(args.jobs, args.partitions, args.processor_time_s,
                         trace=not args.rss_only, guard=not args.no_guard,
                         one_node=args.one_node, finished_ttl_s=args.finished_ttl_s)))


if __name__ == "__main__":
    main()
