"""Seeded generators of faultwatch records and signals: valid ones, and mutations of them."""

from __future__ import annotations

import copy
import random
from typing import Any

import orjson

from faultwatch.core.events import (
    Decision,
    Exit,
    Heartbeat,
    Hit,
    Line,
    Match,
    Notice,
    Output,
    Progress,
    ProgressBatch,
    RankStep,
    RunStart,
    Signal,
    Stage,
    TailLine,
)
from faultwatch.wire import (
    encode_bundle,
    encode_decision,
    encode_exit,
    encode_heartbeat,
    encode_lines,
    encode_notice,
    encode_run_start,
    encode_tick,
)

JUNK: list[Any] = [None, True, False, 0, -1, 1, 2**63 - 1, -(2**63), 0.5, -1e308, 1e308, "", "x",
                   "\n", "\x00", "a" * 300, "é", [], [1], [[1, 2]], [["n0"]], {}, {"a": 1},
                   {"t": "hb"}, "NaN", "999999", 999999, 10**6, [None] * 7]
TEXTS = ["", "hello", "Traceback (most recent call last):",
         "RuntimeError: CUDA error: an illegal memory access was encountered",
         "[rank3]: torch.distributed.DistBackendError: NCCL error", "Step 12/100 | loss 2.3",
         "saving checkpoint at iteration 12", "x" * 2000, "\t\x1b[31mred\x1b[0m", "日本語"]


class Gen:
    """Random records for a few jobs, nodes and runs (seeded: a failure reproduces)."""

    def __init__(self, seed: int, jobs: int = 3) -> None:
        self.r = random.Random(seed)
        self.jobs = [f"job{i}" for i in range(jobs)]
        self.runs = {j: [f"{j}-r{k}" for k in range(3)] + [""] for j in self.jobs}
        self.nodes = ["n0", "n1", "n2"]
        self.ts = 1_000.0

    def tick(self) -> float:
        self.ts += self.r.choice([0.0, 0.01, 0.5, 2.0, 7.0, 30.0])
        return self.ts

    def head(self) -> tuple[str, int, str, str]:
        r = self.r
        job = r.choice(self.jobs)
        attempt = r.choice([0, 0, 0, 1, 1, 2, 3, 5, 50, 9999, 10_000])
        return job, attempt, r.choice(self.nodes), r.choice(self.runs[job])

    def match(self, ts: float) -> Match:
        r = self.r
        return Match(rule=r.choice(["cuda-illegal-memory-access", "nccl-error", "oom", "x"]),
                     category=r.choice(["retryable", "hardware", "fatal", "unknown"]),
                     cascade=r.random() < 0.3, ts=ts, line=r.choice(TEXTS),
                     rank=r.choice([None, 0, 1, 7]), stream=r.choice(["stderr", "stdout", "exit"]),
                     seq=r.randrange(-1, 100), action=r.choice([None, None, "restart", "fail",
                                                                "notify", "blacklist"]),
                     context=tuple(r.choice(TEXTS) for _ in range(r.randrange(3))))

    def signal(self) -> Signal:
        r = self.r
        job, attempt, node, run = self.head()
        ts = self.tick() + r.choice([0.0, 0.0, -5.0, 3.0])
        k = r.randrange(9)
        if k == 0:
            return RunStart(job, attempt, node, ts, run_id=run,
                            run_source=r.choice(["slurm", "generated", "", "flag"]),
                            world_size=r.choice([None, 1, 8]), nnodes=r.choice([None, 1, 3]),
                            rank=r.choice([None, 0]),
                            scheduler=r.choice([{}, {"kind": "slurm", "job_id": "1",
                                                     "labels": {"a": "b"}}]))
        if k == 1:
            return Output(job, attempt, node, ts, r.randrange(1, 50),
                          rank_last_ts=((r.choice([None, 0, 1, 2]), ts),),
                          tail=(TailLine(r.choice([None, 0]), ts, r.choice(TEXTS)),), run_id=run)
        if k == 2:
            return Hit(job, attempt, node, self.match(ts), run_id=run)
        if k == 3:
            return Heartbeat(job, attempt, node, ts, r.random() < 0.9,
                             r.choice([None, ts - 1.0, ts - 100.0]), r.choice([None, ts - 50]),
                             run_id=run)
        if k == 4:
            return Exit(job, attempt, node, ts, r.choice([0, 0, 1, 137, 255, -9]),
                        r.choice([None, 9, 15]), run_id=run)
        if k == 5 and r.random() < 0.5:
            return ProgressBatch(job, attempt, node, tuple(
                RankStep(r.choice([None, 0, 1, 2]), ts - r.choice([0.0, 0.5]),
                         r.randrange(0, 20), r.choice([None, 100]))
                for _ in range(r.randint(1, 4))), run_id=run)
        if k == 5:
            return Progress(job, attempt, node, ts, r.choice([None, 0, 1, 2]),
                            r.randrange(0, 20), r.choice([None, 100]),
                            r.choice([None, 0.1, 0.5, 3.0]), r.choice(["log", "sdk"]), run_id=run)
        if k == 6:
            return Stage(job, attempt, node, ts, r.choice([None, 0, 1]),
                         r.choice(["eval", "checkpoint", "init"]), r.random() < 0.6,
                         r.choice([None, 5.0, 60.0]), run_id=run)
        kind = r.choice(["notify", "retryable_errors", "bootcheck", "gap", "spawn_failed", "new"])
        data = {"notify": {"message": r.choice(TEXTS),
                           "level": r.choice(["warning", "info", "x" * 300, "a\nb", 5]),
                           "rank": r.choice([1, None, "x", -5, 2**40])},
                "retryable_errors": {"patterns": ["StoreTimeout", 5]},
                "bootcheck": {"ok": False, "checks": [{"name": "gpu", "ok": False}, 3]},
                "gap": {"dropped_lines": 7, "reason": "spool full"}}.get(kind, {})
        return Notice(job, attempt, node, ts, kind, data, run_id=run)

    def logs_record(self) -> bytes:
        r = self.r
        sig = self.signal()
        k = r.randrange(6)
        if k == 0 or isinstance(sig, RunStart):
            return encode_run_start(sig if isinstance(sig, RunStart) else RunStart(
                sig.job, sig.attempt, sig.node, self.tick()))
        if k == 1:
            return encode_heartbeat(Heartbeat(sig.job, sig.attempt, sig.node, self.tick(), True,
                                              None), sig.run_id, {"spool_bytes": 3})
        if k == 2:
            return encode_exit(Exit(sig.job, sig.attempt, sig.node, self.tick(), 1), sig.run_id)
        if k == 3:
            kind = r.choice(["progress", "stage", "notify", "gap"])
            data = {"progress": {"step": 3, "rank": 1, "step_time_s": 0.2},
                    "stage": {"stage": "eval", "opens": True, "hang_window_s": 30},
                    "notify": {"message": "m"}, "gap": {"dropped_lines": 1}}[kind]
            return encode_notice(sig.job, sig.attempt, sig.node, self.tick(), kind, data,
                                 run_id=sig.run_id)
        lines = [Line(r.choice(["stdout", "stderr"]), i, self.tick(), r.choice(TEXTS),
                      r.choice([0, 0, 1, 4]), 0) for i in range(r.randrange(0, 12))]
        return encode_lines(sig.job, sig.attempt, sig.node, sig.run_id, lines,
                            rank=r.choice([None, 0, 3]))

    def signals_record(self) -> bytes:
        r = self.r
        if r.random() < 0.1:
            return encode_tick(self.tick())
        sigs = [self.signal() for _ in range(r.randrange(1, 6))]
        job = sigs[0].job
        return encode_bundle(job, [s for s in sigs if s.job == job])

    def decision_record(self) -> bytes:
        r = self.r
        job, attempt, node, run = self.head()
        return encode_decision(Decision(
            id=f"{r.getrandbits(80):020x}", job=job, attempt=attempt,
            action=r.choice(["restart", "blacklist", "fail", "notify"]), kind="hang",
            ts=self.tick(), nodes=(node,), ranks=(1,), rule=r.choice([None, "x"]),
            category=None, message=r.choice(TEXTS), evidence={"a": [1, {"b": None}]},
            budgets={"restarts_used": 1}, rules_version="v", run_id=run,
            scheduler={"kind": "k"}))

    def mutate(self, value: bytes) -> bytes:
        """One random change to a record: a field's value, a missing field, nested junk,
        or bytes cut and flipped."""
        r = self.r
        k = r.randrange(10)
        if k == 0:
            cut = r.randrange(len(value) + 1)
            return value[:cut]
        if k == 1:
            b = bytearray(value)
            for _ in range(r.randrange(1, 4)):
                if b:
                    b[r.randrange(len(b))] = r.randrange(256)
            return bytes(b)
        d = orjson.loads(value)
        for _ in range(r.randrange(1, 3)):
            self._mutate_obj(d, depth=0)
        return orjson.dumps(d)

    def _mutate_obj(self, x: Any, depth: int) -> None:
        r = self.r
        if isinstance(x, dict) and x:
            key = r.choice(sorted(x, key=str))
            v = x[key]
            if isinstance(v, dict | list) and v and r.random() < 0.6 and depth < 6:
                self._mutate_obj(v, depth + 1)
            elif r.random() < 0.2:
                del x[key]
            else:
                x[key] = copy.deepcopy(r.choice(JUNK))  # never share (mutated later)
        elif isinstance(x, list) and x:
            i = r.randrange(len(x))
            if isinstance(x[i], dict | list) and x[i] and r.random() < 0.6 and depth < 6:
                self._mutate_obj(x[i], depth + 1)
            elif r.random() < 0.2:
                del x[i]
            else:
                x[i] = copy.deepcopy(r.choice(JUNK))
