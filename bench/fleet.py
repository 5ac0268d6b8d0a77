"""Fleet benchmark: a simulated fleet of torchrun jobs against ONE faultwatch processor.

    .venv/bin/python bench/fleet.py --bootstrap 127.0.0.1:29092 --duration-s 120

Simulates --jobs jobs x (--nodes-per-job, e.g. 1-4) nodes x --ranks-per-node local ranks in
real time: run-start records, per-rank step lines with `[rankN]:` prefixes, warnings,
checkpoint phases (all ranks quiet for a fraction of the hang window), eval phases, agent
heartbeats every ~2 s (ts, alive, last_output_ts), and faults on --fault-rate of the jobs:
retryable (ConnectionError traceback on one rank, gloo "Connection closed by peer" cascades on
the others, non-zero exits), fatal (ModuleNotFoundError + exits) and silent hangs (every node
keeps heart-beating, nothing is printed). Starts the processor itself (unless --no-processor),
samples the processor group's lag on the logs/signals topics, consumes the decisions topic
and prints one JSON object: generator send rate, processed lines/s, lag over time, decision
and hang-detection latency, false and missed decisions.
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import heapq
import random
import re
import subprocess
import sys
import time
import zlib
from bisect import bisect_left
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson

sys.path.insert(0, str(Path(__file__).resolve().parent))
from fleet_common import (  # noqa: E402
    GroupWatcher,
    broker_pid,
    lag_of,
    percentile,
    proc_cpu_s,
    self_cpu_s,
    start_processor,
    stop_processor,
)
from processor_throughput import summarize_spy  # noqa: E402

from faultwatch.agents.agent import heartbeat_due  # noqa: E402
from faultwatch.core.blast import NOTICE_JOB, NOTICE_KIND  # noqa: E402
from faultwatch.core.events import Exit, Heartbeat, Line, RunStart  # noqa: E402
from faultwatch.kafka.admin import ensure_topics
from faultwatch.wire import (  # noqa: E402
    encode_exit,
    encode_heartbeat,
    encode_lines,
    encode_run_start,
    log_key,
)
from faultwatch.wire.topics import Topics  # noqa: E402

EXPECTED = {  # fault kind -> (decision kind, action, root rule)
    "retryable": ("error", "restart", "python-network-error"),
    "fatal": ("error", "fail", "python-import-error"),
    "hang": ("hang", "restart", None),
}
WARNINGS = [
    ["/usr/local/lib/python3.10/dist-packages/torch/autograd/graph.py:744: UserWarning: Plan "
     "failed with a cudnnException: CUDNN_BACKEND_EXECUTION_PLAN_DESCRIPTOR: cudnnFinalize "
     "Descriptor Failed cudnn_status: CUDNN_STATUS_NOT_SUPPORTED",
     "  return Variable._execution_engine.run_backward(  # Calls into the C++ engine to run "
     "the backward pass"],
    ["/usr/local/lib/python3.10/dist-packages/torch/utils/checkpoint.py:464: UserWarning: "
     "torch.utils.checkpoint: the use_reentrant parameter should be passed explicitly.",
     "  warnings.warn("],
    ["[W reducer.cpp:1389] Warning: find_unused_parameters=True was specified in DDP "
     "constructor, but did not find any unused parameters in the forward pass."],
    ["WARNING: retrying request after ConnectionError (attempt 1/5)"],
    ["Token indices sequence length is longer than the specified maximum sequence length for "
     "this model (2411 > 2048). Running this sequence through the model will result in "
     "indexing errors"],
]
AGENT_START = [
    "WARNING:torch.distributed.run:Setting OMP_NUM_THREADS environment variable for each "
    "process to be 1 in default, to avoid your system being overloaded",
    "INFO:torch.distributed.elastic.agent.server.api:[default] Starting worker group",
    "INFO:torch.distributed.elastic.agent.server.api:[default] Rendezvous complete for workers.",
]


@dataclass
class Node:
    name: str
    job: Job
    index: int
    ranks: list[int]
    run_id: str
    started_ts: float = 0.0
    buf: list[Line] = field(default_factory=list)
    flush_at: float | None = None
    seq: dict[str, int] = field(default_factory=lambda: {"stdout": 0, "stderr": 0})
    last_output_ts: float | None = None
    last_hb_ts: float | None = None
    hb_seen_output_ts: float | None = None  # last_output_ts at the previous heartbeat tick
    alive: bool = True
    exited: bool = False


@dataclass
class Job:
    name: str
    nodes: list[Node] = field(default_factory=list)
    step: int = 0
    total: int = 100000
    step_s: float = 4.0
    ckpt_every: int = 30
    eval_every: int = 25
    fault: str | None = None
    fault_at: float = 0.0
    halted: bool = False  # no more step lines (fault or hang)
    fault_line_ts: float | None = None
    first_exit_ts: float | None = None
    silence_start: float | None = None
    hang_ideal_ts: float | None = None
    quiet_max_s: float = 0.0  # longest planned quiet phase (startup/checkpoint)
    in_stage: str | None = None  # a checkpoint is under way (its stage window applies)

    @property
    def world(self) -> int:
        return sum(len(n.ranks) for n in self.nodes)


class Fleet:
    """The simulation: an event heap driven by the wall clock; sends via one producer."""

    def __init__(self, args: argparse.Namespace, producer: Any, topic: str):
        self.a, self.producer, self.topic = args, producer, topic
        self.rng = random.Random(args.seed)
        self.heap: list[tuple[float, int, Callable[..., Any], tuple[Any, ...]]] = []
        self.n = 0
        self.jobs: list[Job] = []
        self.sent = Counter()
        self.bytes = 0
        self.lateness: list[float] = []
        self.meta: list[tuple[int, int, int]] = []  # (partition, offset, lines) of lines records
        self.send_errors = 0
        self.pending: set[Any] = set()
        self.stopping = False

    # -- setup ------------------------------------------------------------------------
    def build(self, t0: float) -> None:
        a, rng = self.a, self.rng
        lo, hi = a.nodes_lo, a.nodes_hi
        kinds = [k for k in ("retryable", "fatal", "hang")]
        for j in range(a.jobs):
            job = Job(name=f"{a.job_prefix}job-{j:05d}",
                      step_s=rng.uniform(a.step_lo_s, a.step_hi_s),
                      ckpt_every=rng.randint(20, 40), eval_every=rng.randint(15, 35))
            job.step = rng.randint(0, 5000)
            job.total = job.step + 100000
            nn = rng.randint(lo, hi)
            for i in range(nn):
                ranks = list(range(i * a.ranks_per_node, (i + 1) * a.ranks_per_node))
                # a node of its own per job: the blast-radius guard counts distinct node
                # names (jobs sharing "node-0" would be a 4-node fleet to it)
                job.nodes.append(Node(name=f"{job.name}-node-{i}", job=job, index=i, ranks=ranks,
                                      run_id=f"{job.name}-{i}-r0"))
            self.jobs.append(job)
            start = t0 + rng.uniform(0, a.start_spread_s)
            self.at(start, self.job_start, job)
        ordinary = list(self.jobs)
        if a.flood_lines_per_s > 0:  # one more job, whose one node floods (no fault)
            job = Job(name=f"{a.job_prefix}flood", step_s=a.step_hi_s, ckpt_every=10**9,
                      eval_every=10**9)
            job.nodes.append(Node(name=f"{job.name}-node-0", job=job, index=0,
                                  ranks=list(range(a.ranks_per_node)), run_id="flood-0-r0"))
            self.jobs.append(job)
            self.at(t0, self.job_start, job)
            self.at(t0 + a.flood_start_s, self.flood, job.nodes[0], t0 + a.flood_start_s
                    + a.flood_s, 0)
        nfault = int(round(a.jobs * a.fault_rate))
        for k, job in enumerate(rng.sample(ordinary, nfault)):
            job.fault = kinds[k % 3]
            w, d = a.hang_window_s, a.duration_s
            if job.fault == "hang":
                job.fault_at = t0 + rng.uniform(0.15 * d, max(0.15 * d + 1, d - w - 15))
            else:
                job.fault_at = t0 + rng.uniform(0.15 * d, d - 12)
            self.at(job.fault_at, self.inject, job)

    def at(self, t: float, fn: Callable[..., Any], *args: Any) -> None:
        self.n += 1
        heapq.heappush(self.heap, (t, self.n, fn, args))

    # -- sending ----------------------------------------------------------------------
    async def send(self, node: Node, value: bytes, kind: str, lines: int = 0) -> None:
        key = log_key(node.job.name, node.name)
        self.sent[kind] += 1
        self.sent["lines"] += lines
        self.bytes += len(value)
        fut = await self.producer.send(self.topic, value=value, key=key)
        if lines:
            def done(f: Any, n: int = lines) -> None:
                self.pending.discard(f)
                if f.cancelled() or f.exception() is not None:
                    self.send_errors += 1
                    return
                md = f.result()
                self.meta.append((md.partition, md.offset, n))
            self.pending.add(fut)
            fut.add_done_callback(done)

    def emit(self, node: Node, ts: float, text: str, stream: str = "stdout") -> None:
        node.seq[stream] += 1
        node.buf.append(Line(stream, node.seq[stream], ts, text))
        node.last_output_ts = max(node.last_output_ts or ts, ts)
        if node.flush_at is None:
            node.flush_at = ts + self.a.linger_s
            self.at(node.flush_at, self.flush, node)

    async def flush(self, node: Node, now: float | None = None) -> None:
        node.flush_at = None
        if not node.buf:
            return
        buf, node.buf = node.buf, []
        for i in range(0, len(buf), self.a.lines_per_record):
            chunk = buf[i:i + self.a.lines_per_record]
            v = encode_lines(node.job.name, 0, node.name, node.run_id, chunk)
            await self.send(node, v, "lines_records", len(chunk))

    async def flood(self, node: Node, until: float, k: int, t: float) -> None:
        """--flood-lines-per-s from one node, in records of --lines-per-record lines, every
        FLOOD_TICK_S (bypassing the linger: the agent sends full records at once)."""
        if t >= until or self.stopping:
            return
        n = int(self.a.flood_lines_per_s * FLOOD_TICK_S)
        per = self.a.lines_per_record
        for i in range(0, n, per):
            m = min(per, n - i)
            chunk = [Line("stdout", k + j, t + (i + j) * FLOOD_TICK_S / n,
                          f"[rank{(k + j) % 8}]: flood {k + j} debug: tensor stats min 0.0 "
                          "max 1.0 mean 0.5") for j in range(m)]
            node.last_output_ts = chunk[-1].ts
            await self.send(node, encode_lines(node.job.name, 0, node.name, node.run_id, chunk),
                            "lines_records", m)
            self.sent["flood_lines"] += m
        self.at(t + FLOOD_TICK_S, self.flood, node, until, k + n)

    # -- job behaviour ----------------------------------------------------------------
    async def job_start(self, job: Job, t: float) -> None:
        for node in job.nodes:
            node.started_ts = t
            ev = RunStart(job=job.name, attempt=0, node=node.name, ts=t, run_id=node.run_id,
                          world_size=job.world, nnodes=len(job.nodes), rank=None,
                          local_ranks=tuple(range(len(node.ranks))), host=f"{job.name}-{node.name}",
                          pid=1000 + node.index, cmd=("torchrun", "train.py"),
                          agent_version="bench")
            await self.send(node, encode_run_start(ev), "start")
            for k, s in enumerate(AGENT_START):
                self.emit(node, t + 0.01 * k, s, "stderr")
            self.at(t + self.rng.uniform(0.2, 2.0), self.heartbeat, node)
        quiet = self.rng.uniform(0.2, 0.6) * self.a.hang_window_s  # init / first step
        job.quiet_max_s = max(job.quiet_max_s, quiet)
        self.at(t + quiet, self.job_step, job)

    async def job_step(self, job: Job, t: float) -> None:
        if job.halted or self.stopping:
            return
        job.step += 1
        rng = self.rng
        loss = 2.0 + 3.0 / (1 + job.step / 1000.0) + rng.uniform(-0.05, 0.05)
        ms = job.step_s * 1000 * rng.uniform(0.95, 1.05)
        for node in job.nodes:
            for r in node.ranks:
                for k in range(self.a.lines_per_step):
                    self.emit(node, t + rng.uniform(0, 0.05),
                              f"[rank{r}]: [{k}] step {job.step}/{job.total} | loss {loss:.4f} | "
                              f"lr {3e-4:.2e} | grad_norm {rng.uniform(0.5, 2):.2f} | tokens/s "
                              f"{int(4096 * 8 / ms * 1000)} | {ms:.1f} ms/step" if k else
                              f"[rank{r}]: step {job.step}/{job.total} | loss {loss:.4f} | lr "
                              f"{3e-4:.2e} | grad_norm {rng.uniform(0.5, 2):.2f} | tokens/s "
                              f"{int(4096 * 8 / ms * 1000)} | {ms:.1f} ms/step")
            if rng.random() < self.a.warn_rate:
                r = rng.choice(node.ranks)
                for ln in rng.choice(WARNINGS):
                    self.emit(node, t + 0.06, f"[rank{r}]: {ln}", "stderr")
        nxt = t + job.step_s * rng.uniform(0.9, 1.1)
        if job.step % job.ckpt_every == 0:
            q = rng.uniform(self.a.ckpt_lo, self.a.ckpt_hi) * self.a.hang_window_s
            job.quiet_max_s = max(job.quiet_max_s, q)
            for node in job.nodes:
                for r in node.ranks:
                    self.emit(node, t + 0.1, f"[rank{r}]: saving checkpoint at iteration "
                                             f"{job.step:8d} to /ckpt/{job.name}")
            job.in_stage = "checkpoint"
            self.at(t + 0.1 + q, self.ckpt_done, job, q)
            return
        if job.step % job.eval_every == 0:
            # no in_stage: these eval lines match no built-in eval stage rule, so the
            # normal window applies and a hang during eval is due like any other
            self.at(t + 0.5, self.eval_step, job, 1, rng.randint(6, 12))
            return
        self.at(nxt, self.job_step, job)

    async def ckpt_done(self, job: Job, q: float, t: float) -> None:
        if job.halted or self.stopping:
            return
        job.in_stage = None
        for node in job.nodes:
            for r in node.ranks:
                self.emit(node, t, f"[rank{r}]:   successfully saved checkpoint at iteration "
                                   f"{job.step:8d} to /ckpt/{job.name} (took {q:.1f}s)")
        self.at(t + job.step_s, self.job_step, job)

    async def eval_step(self, job: Job, i: int, n: int, t: float) -> None:
        if job.halted or self.stopping:
            return
        for node in job.nodes:
            for r in node.ranks:
                self.emit(node, t + self.rng.uniform(0, 0.05),
                          f"[rank{r}]: eval step {i}/{n} | val_loss {self.rng.uniform(2, 3):.4f}")
        if i < n:
            self.at(t + 1.0, self.eval_step, job, i + 1, n)
            return
        for node in job.nodes:
            for r in node.ranks:
                self.emit(node, t + 0.1, f"[rank{r}]: validation loss at iteration {job.step} | "
                                         f"lm loss value: {self.rng.uniform(2, 3):.3E}")
        self.at(t + job.step_s, self.job_step, job)

    async def heartbeat(self, node: Node, t: float) -> None:
        if node.exited or self.stopping:
            return
        # the agent's cadence (agents/agent.py heartbeat_due): every interval in which the
        # node printed nothing, else every --hb-flowing-s
        printed = node.last_output_ts != node.hb_seen_output_ts
        node.hb_seen_output_ts = node.last_output_ts
        if not heartbeat_due(printed, t - (node.last_hb_ts or node.started_ts or t),
                             self.a.hb_flowing_s):
            self.sent["heartbeats_skipped"] += 1
            self.at(t + self.a.hb_s * self.rng.uniform(0.95, 1.05), self.heartbeat, node)
            return
        await self.flush(node)
        hb = Heartbeat(job=node.job.name, attempt=0, node=node.name, ts=t, alive=True,
                       last_output_ts=node.last_output_ts, started_ts=node.started_ts)
        node.last_hb_ts = t
        await self.send(node, encode_heartbeat(hb, node.run_id, {"spool": 0}), "heartbeats")
        job = node.job
        if job.fault == "hang" and job.halted and job.hang_ideal_ts is None:
            w = self.a.hang_window_s
            ok = all(n.last_hb_ts is not None and
                     n.last_hb_ts - (n.last_output_ts or n.started_ts) >= w for n in job.nodes)
            if ok:
                job.hang_ideal_ts = t
        self.at(t + self.a.hb_s * self.rng.uniform(0.95, 1.05), self.heartbeat, node)

    # -- faults -------------------------------------------------------------------------
    async def inject(self, job: Job, t: float) -> None:
        if self.stopping:
            return
        job.halted = True
        rng = self.rng
        if job.fault == "hang":
            job.silence_start = max((n.last_output_ts or n.started_ts) for n in job.nodes)
            if job.in_stage is not None:
                # hung inside a checkpoint: its stage window (3600 s, built-in rule
                # stage-checkpoint-save-start) applies, so no decision is due within the run
                job.fault = f"hang-in-{job.in_stage}"
            return
        culprit_node = rng.choice(job.nodes)
        culprit = rng.choice(culprit_node.ranks)
        if job.fault == "retryable":
            frames = ['  File "/workspace/data/remote.py", line 88, in fetch_shard',
                      "    resp = session.get(url, timeout=30)",
                      '  File "/usr/lib/python3.10/site-packages/requests/adapters.py", '
                      "line 519, in send",
                      "    raise ConnectionError(e, request=request)"]
            final = ("ConnectionError: HTTPSConnectionPool(host='storage.internal', port=443): "
                     "Max retries exceeded with url: /shards/00042.tar (Caused by "
                     "NewConnectionError('Failed to establish a new connection'))")
        else:
            frames = ['  File "/workspace/train.py", line 211, in <module>',
                      "    main()",
                      '  File "/workspace/train.py", line 120, in main',
                      "    import x"]
            final = "ModuleNotFoundError: No module named 'x'"
        lines = ["Traceback (most recent call last):", *frames, final]
        for k, ln in enumerate(lines):
            self.emit(culprit_node, t + 0.001 * k, f"[rank{culprit}]: {ln}", "stderr")
        job.fault_line_ts = t + 0.001 * (len(lines) - 1)
        tc = t + rng.uniform(0.3, 1.0)
        self.at(tc, self.cascade, job, culprit)
        te = t + rng.uniform(1.0, 1.4)
        local = culprit_node.ranks.index(culprit)
        self.at(te, self.node_exit, culprit_node, local)
        if self.a.others_exit:
            for node in job.nodes:
                if node is not culprit_node:
                    self.at(te + rng.uniform(0.3, 2.0), self.node_exit, node, 0)

    async def cascade(self, job: Job, culprit: int, t: float) -> None:
        for node in job.nodes:
            for r in node.ranks:
                if r == culprit:
                    continue
                self.emit(node, t, f"[rank{r}]: Traceback (most recent call last):", "stderr")
                self.emit(node, t, f'[rank{r}]:   File "/workspace/train.py", line 305, in '
                                   "train_step", "stderr")
                self.emit(node, t, f"[rank{r}]:     dist.all_reduce(grad)", "stderr")
                self.emit(node, t, f"[rank{r}]: RuntimeError: [../third_party/gloo/gloo/"
                                   "transport/tcp/pair.cc:598] Connection closed by peer "
                                   f"[10.0.0.{r % 250}]:{29500 + r}", "stderr")

    async def node_exit(self, node: Node, local_rank: int, t: float) -> None:
        if node.exited:
            return
        self.emit(node, t, "ERROR:torch.distributed.elastic.multiprocessing.api:failed "
                           f"(exitcode: 1) local_rank: {local_rank} (pid: {2345 + local_rank}) "
                           "of binary: /usr/bin/python3", "stderr")
        await self.flush(node)
        node.exited = True
        node.alive = False
        if node.job.first_exit_ts is None:
            node.job.first_exit_ts = t
        await self.send(node, encode_exit(Exit(job=node.job.name, attempt=0, node=node.name,
                                               ts=t, exit_code=1), node.run_id), "exits")

    # -- driver -----------------------------------------------------------------------
    async def run(self, t_end: float) -> None:
        while True:
            now = time.time()
            if now >= t_end:
                break
            while self.heap and self.heap[0][0] <= now:
                t, _, fn, args = heapq.heappop(self.heap)
                self.lateness.append(now - t)
                await fn(*args, t)
            await asyncio.sleep(0.01)
        self.stopping = True
        for job in self.jobs:
            for node in job.nodes:
                await self.flush(node)
        await self.producer.flush()
        for _ in range(100):
            if not self.pending:
                break
            await asyncio.sleep(0.05)


class Decisions:
    """Consumes the decisions topic from the beginning (no group), dedupes by id."""

    def __init__(self, bootstrap: str, topic: str):
        self.bootstrap, self.topic = bootstrap, topic
        self.by_id: dict[str, tuple[float, float, dict[str, Any]]] = {}
        self.dups = 0
        self.task: asyncio.Task[None] | None = None

    async def start(self) -> None:
        from aiokafka import AIOKafkaConsumer
        self.c = AIOKafkaConsumer(self.topic, bootstrap_servers=self.bootstrap,
                                  auto_offset_reset="earliest", enable_auto_commit=False,
                                  group_id=None)
        await self.c.start()
        self.task = asyncio.create_task(self._loop())

    async def _loop(self) -> None:
        while True:
            batch = await self.c.getmany(timeout_ms=200)
            now = time.time()
            for msgs in batch.values():
                for m in msgs:
                    d = orjson.loads(m.value)
                    if d["id"] in self.by_id:
                        self.dups += 1
                        continue
                    self.by_id[d["id"]] = (m.timestamp / 1000.0, now, d)

    async def stop(self) -> None:
        if self.task:
            self.task.cancel()
        await self.c.stop()


class _Sent:
    """What a fake producer's send resolves to (partition, offset), like aiokafka's."""

    def __init__(self, partition: int, offset: int) -> None:
        self.partition, self.offset = partition, offset


class MemoryProducer:
    """The in-process mode's producer: records go to a list (key, value, partition)."""

    def __init__(self, partitions: int) -> None:
        self.partitions = partitions
        self.out: list[tuple[bytes, bytes, int]] = []
        self.offsets = [0] * partitions

    async def send(self, topic: str, value: bytes, key: bytes) -> Any:
        p = zlib.crc32(key) % self.partitions
        fut = asyncio.get_running_loop().create_future()
        fut.set_result(_Sent(p, self.offsets[p]))
        self.offsets[p] += 1
        self.out.append((key, value, p))
        return fut

    async def flush(self) -> None:
        return None


async def in_process(a: argparse.Namespace) -> dict[str, Any]:
    """The fleet on a virtual clock through the processor's two stages in this process (no
    Kafka, no Faust): CPU seconds per simulated second of each stage and of the ticks. The
    machine's load does not change these (process CPU time), so before/after compare."""
    from faultwatch.core.policy import policy_for
    from faultwatch.rules import Matcher, load_ruleset
    from faultwatch.streams import gcsettings
    from faultwatch.streams.job_stage import TICK_S, DictStore, JobStage
    from faultwatch.streams.matcher_stage import MatcherStage
    from faultwatch.streams.records import InRecord, LiveRules
    from faultwatch.streams.status_publish import STATUS_S, StatusPublisher
    from faultwatch.wire import encode_status, encode_tick

    rs = load_ruleset([])
    pol = policy_for(rs.policy, {"hang_window_s": a.hang_window_s, "settle_s": a.settle_s,
                          "node_lost_s": a.node_lost_s})
    live = LiveRules(Matcher(rs), pol, rs.version)
    dead: list[Any] = []
    matcher = MatcherStage(live, lambda r, e: dead.append((r, repr(e))))
    jobs = JobStage(live, DictStore(), lambda r, e: dead.append((r, repr(e))))
    prod = MemoryProducer(a.partitions)
    fleet = Fleet(a, prod, "logs")
    t0 = 1_000_000.0
    fleet.build(t0 + 0.5)
    gcsettings.tune()  # as the processor runs (streams/worker.run_worker)
    t_end = t0 + a.duration_s
    cpu = Counter()
    by_kind = Counter()
    decided: dict[str, tuple[float, Any]] = {}
    records = signals_records = 0
    statuses = StatusPublisher()
    status_sent = status_steady = 0
    next_status = t0 + STATUS_S

    def status_every_job(now: float) -> list[tuple[bytes, bytes]]:
        """The publisher before issue 14's third session: every active job every 3 s."""
        from faultwatch.core.status import snapshot

        return [(k, encode_status(snapshot(p.cache[k], now, pol)))
                for p in jobs.parts.values() for k in p.active if k in p.cache]

    step = TICK_S
    t = t0
    while t < t_end + a.drain_timeout_s:
        while fleet.heap and fleet.heap[0][0] <= t and t < t_end:
            tt, _, fn, args = heapq.heappop(fleet.heap)
            await fn(*args, tt)
        if t >= t_end and not fleet.stopping:
            fleet.stopping = True
            for job in fleet.jobs:
                for node in job.nodes:
                    await fleet.flush(node)
        batch = [InRecord("logs", p, i, k, v) for i, (k, v, p) in enumerate(prod.out)]
        prod.out.clear()
        records += len(batch)
        c0 = time.process_time()
        sigs = matcher.process_batch(batch, t)
        c1 = time.process_time()
        signals_records += len(sigs)
        recs = [InRecord("signals", zlib.crc32(k) % a.partitions, i, k, v)
                for i, (k, v) in enumerate(sigs)]
        decs = jobs.process_batch(recs, t)
        c2 = time.process_time()
        for p in range(a.partitions):
            decs += jobs.process_batch([InRecord("signals", p, 0, None, encode_tick(t))], t)
        c3 = time.process_time()
        if t >= next_status and a.status != "off":  # the shell's status timer
            next_status += STATUS_S
            parts = list(jobs.parts.values())
            sent = len(status_every_job(t) if a.status == "every-job"
                       else statuses.due(parts, t, pol))
            status_sent += sent
            if t0 + STEADY_FROM_S <= t < t_end:
                status_steady += sent
        c4 = time.process_time()
        cpu["matcher"] += c1 - c0
        cpu["jobs"] += c2 - c1
        cpu["ticks"] += c3 - c2
        cpu["status"] += c4 - c3
        for d in decs:
            if d.id not in decided:
                decided[d.id] = (t, d)
                by_kind[f"{d.kind}/{d.action}"] += 1
        t += step
        if t >= t_end and not fleet.heap and not prod.out and t > t_end + 2 * a.node_lost_s:
            break
    faulted = {j.name: j for j in fleet.jobs if j.fault in EXPECTED}
    got: dict[str, list[Any]] = {}
    for _, d in decided.values():
        got.setdefault(d.job, []).append(d)
    correct = Counter()
    false = []
    for name, ds in got.items():
        acts = [d for d in ds if d.kind not in REQUESTS]
        job = faulted.get(name)
        for d in acts:
            ok = job is not None and (d.kind, d.action) == EXPECTED[str(job.fault)][:2]
            if ok:
                correct[str(job.fault)] += 1
            elif not (d.kind == "node-lost" and decided[d.id][0] >= t_end + a.node_lost_s
                      - 1.05 * max(a.hb_s, a.hb_flowing_s) - 1.0) \
                    and not fleet_stopped_notice(d.job, d.kind, decided[d.id][0], t_end):
                false.append([d.job, d.kind, d.action, d.rule])
    # missed: no decision of the expected kind and action (a node-lost after the fleet
    # stopped is not counted false, nor does it stand for the fault's decision)
    missed = [n for n, job in faulted.items()
              if not any((d.kind, d.action) == EXPECTED[str(job.fault)][:2]
                         for d in got.get(n, []))]
    total_cpu = sum(cpu.values())
    ranks = sum(j.world for j in fleet.jobs)
    return {"mode": "in-process", "config": {k: v for k, v in vars(a).items()},
            "jobs": len(fleet.jobs), "nodes": sum(len(j.nodes) for j in fleet.jobs),
            "ranks": ranks, "records": records, "signals_records": signals_records,
            "by_type": dict(fleet.sent), "dead_letters": len(dead),
            "cpu_s": {k: round(v, 2) for k, v in cpu.items()},
            "cpu_s_per_simulated_s": round(total_cpu / a.duration_s, 4),
            # each one a send to the status topic by the shell (~0.2 ms of CPU in Faust)
            "status_snapshots_per_simulated_s": round(status_sent / (t - t0), 1),
            # the same while the fleet runs, past its start (every job's first snapshot)
            "status_snapshots_per_s_steady": round(
                status_steady / max(1e-9, a.duration_s - STEADY_FROM_S), 1),
            # ... and so is each table write (the job state's changelog record)
            "table_writes_per_simulated_s": round(
                jobs.metrics.extra.get("table_writes", 0) / (t - t0), 1),
            "ranks_per_core_stages_only": round(ranks * a.duration_s / total_cpu)
            if total_cpu else None,
            # equal digests: the same decisions (ids) at the same simulated times
            "decisions_digest": hashlib.sha256(repr(sorted(
                (i, round(tt, 3)) for i, (tt, _) in decided.items())).encode()).hexdigest()[:16],
            "decisions": {"by_kind_action": dict(by_kind), "expected": len(faulted),
                          "correct": dict(correct), "false_decisions": len(false),
                          "false_examples": false[:10], "missed": len(missed),
                          "missed_examples": missed[:10]}}


def fleet_stopped_notice(job: str, kind: str, decided_ts: float, stopped_ts: float) -> bool:
    """The blast-radius guard's notice (job "(fleet)") once the bench stopped every job at
    its end: every node falls silent at once, the storm the notice is for (expected, not a
    false decision). A notice while the fleet still runs counts as false."""
    return job == NOTICE_JOB and kind == NOTICE_KIND and decided_ts >= stopped_ts


FLOOD_TICK_S = 0.05  # the flood's records go out this often
STEADY_FROM_S = 10.0  # --in-process: jobs start within --start-spread-s (5 s) of the start
REQUESTS = ("diagnose",)  # notify decisions that ask agents for evidence, about no fault


def lines_upto(meta_by_p: dict[int, tuple[list[int], list[int]]], p: int, offset: int) -> int:
    """Lines in records of partition p with offset < `offset`."""
    offs, cum = meta_by_p.get(p, ([], []))
    i = bisect_left(offs, offset)
    return cum[i - 1] if i > 0 else 0


async def main_async(a: argparse.Namespace) -> dict[str, Any]:
    from aiokafka import AIOKafkaProducer
    prefix = a.topic_prefix or f"bench.fleet.{int(time.time())}."
    topics = Topics(prefix)
    group = a.group or f"{prefix}processor"
    await ensure_topics(a.bootstrap, topics, a.partitions)
    out: dict[str, Any] = {"config": {k: v for k, v in vars(a).items()}, "topic_prefix": prefix}
    workdir = Path(a.workdir)
    workdir.mkdir(parents=True, exist_ok=True)
    proc = None
    launcher = "external"
    plog = workdir / f"processor-{prefix.strip('.')}.log"
    if not a.no_processor:
        proc, launcher = start_processor(a.bootstrap, prefix, a.partitions, a.hang_window_s,
                                         a.settle_s, plog, a.launcher)
    out["launcher"] = launcher
    out["processor_log"] = str(plog)
    bpid = broker_pid(int(a.bootstrap.rsplit(":", 1)[1]))
    watcher = GroupWatcher(a.bootstrap, group, [topics.logs, topics.signals])
    await watcher.start()
    decs = Decisions(a.bootstrap, topics.decisions)
    await decs.start()
    # wait for the processor's group to own the partitions before loading it
    t_wait = time.time()
    state = ""
    while time.time() - t_wait < a.startup_timeout_s:
        state = await watcher.group_state()
        if "Stable" in state:
            break
        if proc is not None and proc.poll() is not None:
            raise RuntimeError(f"processor exited: {plog.read_text()[-2000:]}")
        await asyncio.sleep(0.5)
    out["processor_startup_s"] = round(time.time() - t_wait, 2)
    out["group_state_at_start"] = state[:40]
    await asyncio.sleep(2.0)  # Faust finishes recovery after the group is stable

    producer = AIOKafkaProducer(bootstrap_servers=a.bootstrap, linger_ms=a.producer_linger_ms,
                                max_batch_size=1 << 20, acks=1, max_request_size=8 << 20)
    await producer.start()
    fleet = Fleet(a, producer, topics.logs)
    t0 = time.time()
    fleet.build(t0 + 0.5)
    t_end = t0 + a.duration_s
    samples: list[dict[str, Any]] = []
    cpu0 = {"gen": self_cpu_s(), "proc": proc_cpu_s(proc.pid) if proc else None,
            "broker": proc_cpu_s(bpid) if bpid else None}

    async def sampler() -> None:
        while True:
            s = await watcher.sample()
            samples.append({"t": time.time() - t0, "s": s,
                            "proc_cpu": proc_cpu_s(proc.pid) if proc else None,
                            "broker_cpu": proc_cpu_s(bpid) if bpid else None,
                            "gen_cpu": self_cpu_s()})
            await asyncio.sleep(a.sample_s)

    stask = asyncio.create_task(sampler())
    spy = None
    if a.py_spy and proc is not None:  # the processor's profile during the load
        spy = subprocess.Popen(
            [str(Path(sys.executable).parent / "py-spy"), "record", "-p", str(proc.pid),
             "-o", a.py_spy, "--format", "raw", "-r", "50", "-d",
             str(int(min(a.py_spy_s, a.duration_s)))],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    await fleet.run(t_end)
    t_gen_end = time.time()
    gen_cpu = self_cpu_s() - cpu0["gen"]
    await producer.stop()

    # expected decisions
    faulted = {j.name: j for j in fleet.jobs if j.fault in EXPECTED}
    in_stage = {j.name: j for j in fleet.jobs if j.fault and j.fault not in EXPECTED}
    drain_deadline = time.time() + a.drain_timeout_s
    t_drained = None
    while time.time() < drain_deadline:
        s = samples[-1]["s"] if samples else {}
        logs_lag = lag_of(s, topics.logs) if s else 1
        got = {d["job"] for _, _, d in decs.by_id.values()}
        if logs_lag == 0 and t_drained is None and samples and samples[-1]["t"] > t_gen_end - t0:
            t_drained = time.time()
        if t_drained is not None and all(j in got for j in faulted) \
                and time.time() - t_drained > a.settle_s + 3:
            break
        await asyncio.sleep(0.5)
    t_stop = time.time()
    stask.cancel()
    final = await watcher.sample()
    await asyncio.sleep(1.0)
    await decs.stop()
    await watcher.stop()
    cpu_proc = (proc_cpu_s(proc.pid) - cpu0["proc"]) if proc and cpu0["proc"] is not None else None
    if proc is not None:
        stop_processor(proc)

    # ---- analysis ----------------------------------------------------------------------
    meta_by_p: dict[int, tuple[list[int], list[int]]] = {}
    for p in sorted({m[0] for m in fleet.meta}):
        rows = sorted((o, n) for pp, o, n in fleet.meta if pp == p)
        offs, cum, c = [], [], 0
        for o, n in rows:
            c += n
            offs.append(o)
            cum.append(c)
        meta_by_p[p] = (offs, cum)

    def processed_lines(s: dict[str, dict[int, tuple[int, int]]]) -> int:
        return sum(lines_upto(meta_by_p, p, c) for p, (_, c) in s.get(topics.logs, {}).items())

    def lag_lines(s: dict[str, dict[int, tuple[int, int]]]) -> int:
        return sum(lines_upto(meta_by_p, p, e) - lines_upto(meta_by_p, p, c)
                   for p, (e, c) in s.get(topics.logs, {}).items())

    series = []
    for x in samples:
        series.append([round(x["t"], 1), lag_of(x["s"], topics.logs), lag_lines(x["s"]),
                       lag_of(x["s"], topics.signals), processed_lines(x["s"])])
    total_lines = fleet.sent["lines"]
    gen_s = t_gen_end - t0
    # steady-state processing rate: processed lines between 20% and 100% of the generation
    in_gen = [r for r in series if 0.2 * gen_s <= r[0] <= gen_s]
    rate_gen = ((in_gen[-1][4] - in_gen[0][4]) / (in_gen[-1][0] - in_gen[0][0])
                if len(in_gen) >= 2 and in_gen[-1][0] > in_gen[0][0] else None)
    drain_s = (t_drained - t_gen_end) if t_drained else None

    def cpu_pct(key: str) -> float | None:
        xs = [x for x in samples if x[key] is not None]
        if len(xs) < 2:
            return None
        g = [x for x in xs if x["t"] <= gen_s] or xs
        return round(100 * (g[-1][key] - g[0][key]) / max(1e-6, g[-1]["t"] - g[0]["t"]), 1)

    # decisions
    per_job: dict[str, list[tuple[float, float, dict[str, Any]]]] = {}
    for rec in decs.by_id.values():
        per_job.setdefault(rec[2]["job"], []).append(rec)
    false: list[dict[str, Any]] = []
    wrong_root: list[dict[str, Any]] = []
    err_lat_exit: list[float] = []
    err_lat, err_lat_recv, hang_lat, hang_lat_ideal, hang_lat_recv = [], [], [], [], []
    by_kind = Counter()
    matched = Counter()
    # node-lost (and the fleet-storm notice) once the simulated fleet stopped heart-beating
    after_stop = 0  # (expected)
    flood_notices: list[dict[str, Any]] = []
    for job_name, recs in per_job.items():
        recs.sort(key=lambda r: r[0])
        job = faulted.get(job_name)
        k = -1
        for tts, rts, d in recs:
            kind, action, rule = d["reason"]["kind"], d["action"], d["reason"].get("rule")
            by_kind[f"{kind}/{action}"] += 1
            if kind in REQUESTS:
                continue  # a request for stacks before a hang decision: no decision itself
            k += 1
            if fleet_stopped_notice(job_name, kind, tts, t_gen_end):
                after_stop += 1  # the storm notice of the bench's own stop of every job
                continue
            if kind == "node-lost" and \
                    tts >= t_gen_end + a.node_lost_s - 1.05 * max(a.hb_s, a.hb_flowing_s) - 1.0:
                # the generator stops every heartbeat at the end of the run; a node's last
                # record came up to one (flowing) heartbeat interval before that
                after_stop += 1
                continue
            brief = {"job": job_name, "kind": kind, "action": action, "rule": rule,
                     "message": d["reason"].get("message", "")[:160],
                     "injected": job.fault if job else None}
            if job_name == f"{a.job_prefix}flood" and (kind, action) == ("gap", "notify"):
                flood_notices.append(brief)  # its throttling episodes, announced
                continue
            if job is None or k > 0:
                why = "extra decision" if job is not None else (
                    f"{in_stage[job_name].fault}: the stage window applies"
                    if job_name in in_stage else "no fault injected")
                false.append(brief | {"why": why})
                continue
            ek, ea, er = EXPECTED[job.fault]
            if (kind, action) != (ek, ea):
                false.append(brief | {"why": f"expected {ek}/{ea}"})
                continue
            if er is not None and rule != er:
                wrong_root.append(brief | {"expected_rule": er})
            matched[job.fault] += 1
            if job.fault == "hang":
                assert job.silence_start is not None
                due = job.silence_start + a.hang_window_s
                hang_lat.append(tts - due)
                hang_lat_recv.append(rts - due)
                if job.hang_ideal_ts is not None:
                    hang_lat_ideal.append(tts - job.hang_ideal_ts)
            elif job.fault_line_ts is not None:
                err_lat.append(tts - job.fault_line_ts)
                err_lat_recv.append(rts - job.fault_line_ts)
                if job.first_exit_ts is not None:
                    err_lat_exit.append(tts - (job.first_exit_ts + a.settle_s))
    missed = [{"job": j.name, "fault": j.fault, "fault_at_s": round(j.fault_at - t0, 1)}
              for j in faulted.values() if j.name not in per_job]
    nodes = sum(len(j.nodes) for j in fleet.jobs)
    ranks = sum(j.world for j in fleet.jobs)
    # hang-latency p50/p99 vs the window
    out.update({
        "fleet": {"jobs": len(fleet.jobs), "nodes": nodes, "ranks": ranks,
                  "faults": dict(Counter(j.fault for j in faulted.values())),
                  "hangs_inside_a_stage_not_expected": dict(
                      Counter(j.fault for j in in_stage.values())),
                  "hang_window_s": a.hang_window_s, "settle_s": a.settle_s,
                  "longest_planned_quiet_s": round(max(j.quiet_max_s for j in fleet.jobs), 1)},
        "generator": {
            "duration_s": round(gen_s, 1), "records": sum(v for k, v in fleet.sent.items()
                                                          if k != "lines"),
            "by_type": {k: v for k, v in fleet.sent.items() if k != "lines"},
            "lines": total_lines, "bytes": fleet.bytes,
            "records_per_s": round(sum(v for k, v in fleet.sent.items() if k != "lines") / gen_s),
            "lines_per_s": round(total_lines / gen_s),
            "mb_per_s": round(fleet.bytes / gen_s / 1e6, 2),
            "avg_lines_per_record": round(total_lines / max(1, fleet.sent["lines_records"]), 1),
            "cpu_s": round(gen_cpu, 1), "cpu_pct": round(100 * gen_cpu / gen_s, 1),
            "event_lateness_p50_s": percentile(fleet.lateness, 50),
            "event_lateness_p99_s": percentile(fleet.lateness, 99),
            "event_lateness_max_s": round(max(fleet.lateness), 3) if fleet.lateness else None,
            "send_errors": fleet.send_errors},
        "processor": {
            "lines_processed": processed_lines(final),
            "lines_per_s_during_load": round(rate_gen) if rate_gen else None,
            "offered_lines_per_s": round(total_lines / gen_s),
            "drain_s_after_load": round(drain_s, 1) if drain_s is not None else None,
            "lines_per_s_overall": round(processed_lines(final) / ((t_drained or t_stop) - t0)),
            "logs_lag_records_max": max((r[1] for r in series), default=None),
            "logs_lag_lines_max": max((r[2] for r in series), default=None),
            "signals_lag_max": max((r[3] for r in series), default=None),
            "logs_lag_records_final": lag_of(final, topics.logs),
            "signals_lag_final": lag_of(final, topics.signals),
            "cpu_pct_during_load": cpu_pct("proc_cpu"),
            "cpu_s_total": round(cpu_proc, 1) if cpu_proc is not None else None,
            "lag_series_cols": ["t_s", "logs_lag_records", "logs_lag_lines", "signals_lag",
                                "lines_processed"],
            "lag_series": series[:: max(1, len(series) // a.series_points)]},
        "broker_cpu_pct_during_load": cpu_pct("broker_cpu"),
        "decisions": {
            "received_unique": len(decs.by_id), "duplicates_seen": decs.dups,
            "by_kind_action": dict(by_kind),
            "expected": len(faulted), "correct": dict(matched),
            "false_decisions": len(false), "false_examples": false[:10],
            "node_lost_after_fleet_stopped": after_stop,
            "flood_notices": flood_notices[:4], "flood_lines": fleet.sent.get("flood_lines", 0),
            "wrong_root_rule": len(wrong_root), "wrong_root_examples": wrong_root[:5],
            "missed": len(missed), "missed_examples": missed[:10],
            "error_latency_s": {"n": len(err_lat), "p50": percentile(err_lat, 50),
                                "p99": percentile(err_lat, 99),
                                "max": round(max(err_lat), 3) if err_lat else None,
                                "note": "decision record's topic timestamp - root error line ts "
                                        f"(includes settle_s={a.settle_s})"},
            "error_latency_after_first_exit_plus_settle_s": {
                "p50": percentile(err_lat_exit, 50), "p99": percentile(err_lat_exit, 99),
                "note": "pipeline + tick share: decision topic ts - (first exit ts + settle_s)"},
            "error_latency_recv_s": {"p50": percentile(err_lat_recv, 50),
                                     "p99": percentile(err_lat_recv, 99)},
            "hang_latency_after_window_s": {
                "n": len(hang_lat), "p50": percentile(hang_lat, 50),
                "p99": percentile(hang_lat, 99),
                "max": round(max(hang_lat), 3) if hang_lat else None,
                "note": "decision topic ts - (silence start + hang window)"},
            "hang_latency_after_first_proving_heartbeat_s": {
                "p50": percentile(hang_lat_ideal, 50), "p99": percentile(hang_lat_ideal, 99)},
        },
    })
    lags_s = [float(x) for x in re.findall(r"logs_event_lag_s=([0-9.]+)",
                                            plog.read_text(errors="replace"))] \
        if plog.exists() else []
    out["processor"]["logs_event_lag_s_max"] = max(lags_s, default=None)
    out["processor"]["logs_event_lag_s_note"] = (
        "the processor's own report every 10 s: now - ts of the newest line it matched")
    if spy is not None:
        spy.wait(30)
        out["processor_profile"] = summarize_spy(a.py_spy)
    return out


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--bootstrap", default="127.0.0.1:29092")
    p.add_argument("--topic-prefix", default="", help="default bench.fleet.<time>.")
    p.add_argument("--group", default="", help="processor group (default <prefix>processor)")
    p.add_argument("--partitions", type=int, default=4)
    p.add_argument("--duration-s", type=float, default=120.0)
    p.add_argument("--jobs", type=int, default=1000)
    p.add_argument("--nodes-per-job", default="1-4", help="N or LO-HI (uniform)")
    p.add_argument("--ranks-per-node", type=int, default=8)
    p.add_argument("--fault-rate", type=float, default=0.06,
                   help="fraction of jobs with an injected fault (split retryable/fatal/hang)")
    p.add_argument("--hang-window-s", type=float, default=30.0)
    p.add_argument("--settle-s", type=float, default=1.0)
    p.add_argument("--node-lost-s", type=float, default=30.0,
                   help="the processor's node_lost_s (analysis only: node-lost decisions "
                        "this long after the fleet stopped are not false)")
    p.add_argument("--step-lo-s", type=float, default=2.0)
    p.add_argument("--step-hi-s", type=float, default=6.0)
    p.add_argument("--lines-per-step", type=int, default=1, help="lines per rank per step")
    p.add_argument("--warn-rate", type=float, default=0.01, help="per node per step")
    p.add_argument("--ckpt-lo", type=float, default=0.3, help="checkpoint quiet, x hang window")
    p.add_argument("--ckpt-hi", type=float, default=0.7)
    p.add_argument("--hb-s", type=float, default=2.0, help="agent --heartbeat-s")
    p.add_argument("--hb-flowing-s", type=float, default=10.0,
                   help="agent --heartbeat-flowing-s (2 = every heartbeat, the old agent)")
    p.add_argument("--linger-s", type=float, default=0.5, help="agent line batching linger")
    p.add_argument("--lines-per-record", type=int, default=100)
    p.add_argument("--start-spread-s", type=float, default=5.0)
    p.add_argument("--others-exit", action=argparse.BooleanOptionalAction, default=True,
                   help="other nodes of a failed job also exit non-zero (torchrun behaviour)")
    p.add_argument("--producer-linger-ms", type=int, default=20)
    p.add_argument("--sample-s", type=float, default=2.0)
    p.add_argument("--series-points", type=int, default=40)
    p.add_argument("--drain-timeout-s", type=float, default=90.0)
    p.add_argument("--startup-timeout-s", type=float, default=90.0)
    p.add_argument("--no-processor", action="store_true", help="a processor is already running")
    p.add_argument("--launcher", choices=["auto", "cli", "fallback"], default="auto")
    p.add_argument("--workdir", default="/tmp/fleetbench")
    p.add_argument("--job-prefix", default="")
    p.add_argument("--seed", type=int, default=7)
    p.add_argument("--flood-lines-per-s", type=float, default=0.0,
                   help="one more job whose one node prints this many lines/s (noisy neighbour)")
    p.add_argument("--flood-s", type=float, default=60.0, help="... for this long")
    p.add_argument("--flood-start-s", type=float, default=20.0, help="... from this time on")
    p.add_argument("--out", default="", help="also write the JSON here")
    p.add_argument("--py-spy", default="", help="write a py-spy raw profile of the processor "
                                                "(during the load) here")
    p.add_argument("--py-spy-s", type=float, default=60.0)
    p.add_argument("--status", choices=["publisher", "every-job", "off"], default="publisher",
                   help="--in-process: status snapshots by the shipped publisher, or every "
                        "active job every 3 s (the publisher before), or none")
    p.add_argument("--in-process", action="store_true",
                   help="no Kafka: the fleet on a virtual clock through both stages in this "
                        "process; prints their CPU cost")
    a = p.parse_args(argv)
    lo, _, hi = a.nodes_per_job.partition("-")
    a.nodes_lo, a.nodes_hi = int(lo), int(hi or lo)
    return a


def dumps(res: dict[str, Any]) -> str:
    """Indented JSON with numeric rows (the lag series) kept on one line each."""
    s = orjson.dumps(res, option=orjson.OPT_INDENT_2).decode()
    return re.sub(r"\[\s+(-?[\d.]+(?:,\s+-?[\d.]+|,\s+null)*)\s+\]",
                  lambda m: "[" + ", ".join(m.group(1).split()).replace(",,", ",") + "]", s)


def main() -> None:
    a = parse_args()
    res = asyncio.run(in_process(a) if a.in_process else main_async(a))
    s = dumps(res)
    if a.out:
        Path(a.out).write_text(s)
    print(s)


if __name__ == "__main__":
    main()
