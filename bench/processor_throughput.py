"""Processor throughput vs a raw aiokafka consume loop, on the same pre-filled logs topic.

    .venv/bin/python bench/processor_throughput.py --bootstrap 127.0.0.1:29092 --lines 500000

1. fills `<prefix>logs` with --lines lines in records of --lines-per-record (torchrun
   `[rankN]:` step lines, some warnings, a heartbeat every --hb-every line records per node);
2. peer: a raw aiokafka consumer reads the topic from the beginning and orjson-decodes every
   record (touching every line row); once before the processor and once after it (the
   ratio uses their mean: the machine's load changes in between);
3. in-process core (no Kafka, no Faust), for the breakdown: the shipped stage classes the
   shell calls, `MatcherStage.process_batch` over the same records and
   `JobStage.process_batch` over the signals records it produced;
4. the processor: starts `faultwatch process` on that prefix and times until its consumer
   group's committed offsets reach the end offsets of the logs topic (and of the signals
   topic it produced). Optionally records a py-spy profile of it (--py-spy).
Prints one JSON object: lines/s for each and the processor/peer ratio, wall-clock and per
CPU second (on a shared machine the second is the steadier one).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import subprocess
import sys
import time
import zlib
from collections import Counter
from collections.abc import Awaitable, Callable
from functools import partial
from pathlib import Path
from typing import Any

import orjson

sys.path.insert(0, str(Path(__file__).resolve().parent))
from fleet_common import (  # noqa: E402
    GroupWatcher,
    broker_pid,
    lag_of,
    proc_cpu_s,
    self_cpu_s,
    start_processor,
    stop_processor,
)

from faultwatch.core.events import Heartbeat, Line, RunStart  # noqa: E402
from faultwatch.kafka.admin import ensure_topics
from faultwatch.wire import (  # noqa: E402
    encode_heartbeat,
    encode_lines,
    encode_run_start,
    log_key,
)
from faultwatch.wire.topics import Topics  # noqa: E402

WARN = ("/usr/local/lib/python3.10/dist-packages/torch/utils/checkpoint.py:464: UserWarning: "
        "torch.utils.checkpoint: the use_reentrant parameter should be passed explicitly.")


def make_records(a: argparse.Namespace) -> tuple[list[tuple[bytes, bytes]], int]:
    """(key, value) records in agent order, and the number of lines in them."""
    rng = random.Random(a.seed)
    nodes = [(f"tp-job-{j:04d}", f"node-{i}")
             for j in range(a.jobs) for i in range(a.nodes_per_job)]
    recs: list[tuple[bytes, bytes]] = []
    t = time.time() - 3600
    for job, node in nodes:
        ev = RunStart(job=job, attempt=0, node=node, ts=t, run_id=f"{job}-{node}",
                      world_size=a.nodes_per_job * 8, nnodes=a.nodes_per_job,
                      local_ranks=tuple(range(8)), host=node, pid=1, cmd=("torchrun",))
        recs.append((log_key(job, node), encode_run_start(ev)))
    n_records = a.lines // a.lines_per_record
    seq: Counter[tuple[str, str]] = Counter()
    step: Counter[tuple[str, str]] = Counter()
    count: Counter[tuple[str, str]] = Counter()
    lines_total = 0
    for k in range(n_records):
        job, node = nodes[k % len(nodes)]
        base = int(node.rsplit("-", 1)[1]) * 8
        lines: list[Line] = []
        ts = t + k * 0.001
        while len(lines) < a.lines_per_record:
            step[(job, node)] += 1
            s = step[(job, node)]
            for r in range(base, base + 8):
                if len(lines) >= a.lines_per_record:
                    break
                seq[(job, node)] += 1
                if rng.random() < 0.01:
                    txt = f"[rank{r}]: {WARN}"
                else:
                    txt = (f"[rank{r}]: step {s}/100000 | loss {rng.uniform(2, 3):.4f} | lr "
                           f"3.00e-04 | grad_norm {rng.uniform(0.5, 2):.2f} | tokens/s 48211 | "
                           f"{rng.uniform(800, 900):.1f} ms/step")
                lines.append(Line("stdout", seq[(job, node)], ts, txt))
        lines_total += len(lines)
        recs.append((log_key(job, node), encode_lines(job, 0, node, f"{job}-{node}", lines)))
        count[(job, node)] += 1
        if a.hb_every and count[(job, node)] % a.hb_every == 0:
            hb = Heartbeat(job=job, attempt=0, node=node, ts=ts, alive=True, last_output_ts=ts,
                           started_ts=t)
            recs.append((log_key(job, node), encode_heartbeat(hb, f"{job}-{node}")))
    return recs, lines_total


async def fill(a: argparse.Namespace, topic: str,
               recs: list[tuple[bytes, bytes]]) -> dict[str, Any]:
    from aiokafka import AIOKafkaProducer
    p = AIOKafkaProducer(bootstrap_servers=a.bootstrap, linger_ms=50, max_batch_size=1 << 20,
                         acks=1, max_request_size=16 << 20)
    await p.start()
    t0, c0 = time.time(), self_cpu_s()
    futs = []
    for k, v in recs:
        futs.append(await p.send(topic, value=v, key=k))
    await p.flush()
    await asyncio.gather(*futs)
    dt = time.time() - t0
    await p.stop()
    return {"records": len(recs), "seconds": round(dt, 2), "records_per_s": round(len(recs) / dt),
            "mb": round(sum(len(v) for _, v in recs) / 1e6, 1),
            "cpu_s": round(self_cpu_s() - c0, 1)}


async def peer(a: argparse.Namespace, topic: str, n_records: int) -> dict[str, Any]:
    """Raw aiokafka: read every record of the topic and orjson-decode it."""
    from aiokafka import AIOKafkaConsumer, TopicPartition
    c = AIOKafkaConsumer(bootstrap_servers=a.bootstrap, enable_auto_commit=False, group_id=None,
                         auto_offset_reset="earliest", max_partition_fetch_bytes=8 << 20,
                         fetch_max_bytes=64 << 20)
    await c.start()
    tps = [TopicPartition(topic, p) for p in range(a.partitions)]
    c.assign(tps)
    await c.seek_to_beginning(*tps)
    t0, c0 = time.time(), self_cpu_s()
    got = lines = 0
    while got < n_records:
        batch = await c.getmany(timeout_ms=1000, max_records=10000)
        for msgs in batch.values():
            for m in msgs:
                d = orjson.loads(m.value)
                got += 1
                if d.get("t") == "lines":
                    for row in d["lines"]:
                        lines += 1 if row[3] else 1
        if time.time() - t0 > a.timeout_s:
            break
    dt = time.time() - t0
    await c.stop()
    cpu_s = self_cpu_s() - c0
    return {"records": got, "lines": lines, "seconds": round(dt, 2),
            "lines_per_s": round(lines / dt), "records_per_s": round(got / dt),
            "cpu_s": round(cpu_s, 2), "lines_per_cpu_s": round(lines / max(cpu_s, 1e-3))}


def core_stages(recs: list[tuple[bytes, bytes]], lines_total: int,
                partitions: int) -> dict[str, Any]:
    """The processor's pure-Python work without Kafka/Faust, to split its cost: the shipped
    stage classes the Faust shell calls (`MatcherStage.process_batch` over logs records,
    `JobStage.process_batch` over the signals records it produced, states in a DictStore),
    in batches of the shell's size, with the partitions the worker would see."""
    from faultwatch.core.job import JobState
    from faultwatch.core.policy import policy_for
    from faultwatch.rules import Matcher, load_ruleset
    from faultwatch.streams import gcsettings
    from faultwatch.streams.faust_app import BATCH as STAGE_BATCH  # the shell's batch size
    from faultwatch.streams.job_stage import DictStore, JobStage
    from faultwatch.streams.matcher_stage import MatcherStage
    from faultwatch.streams.records import InRecord, LiveRules
    rs = load_ruleset([])
    live = LiveRules(Matcher(rs), policy_for(rs.policy, {"hang_window_s": 300, "settle_s": 1}),
                     str(rs.version))
    dead: list[tuple[InRecord, Exception]] = []

    def dead_letter(rec: InRecord, err: Exception) -> None:
        dead.append((rec, err))

    def part(key: bytes | None) -> int:
        return zlib.crc32(key or b"") % partitions  # a stable stand-in for Kafka's murmur2

    logs = [InRecord("logs", part(k), i, k, v) for i, (k, v) in enumerate(recs)]
    matcher = MatcherStage(live, dead_letter)
    gcsettings.tune()  # as the processor runs (streams/worker.run_worker)
    t0 = time.process_time()
    signals_recs: list[tuple[bytes, bytes]] = []
    for i in range(0, len(logs), STAGE_BATCH):
        signals_recs += matcher.process_batch(logs[i:i + STAGE_BATCH], time.time())
    t_match = time.process_time() - t0
    sig_in = [InRecord("signals", part(k), i, k, v) for i, (k, v) in enumerate(signals_recs)]
    store = DictStore()
    jobs = JobStage(live, store, dead_letter)
    t0 = time.process_time()
    n_decisions = 0
    for i in range(0, len(sig_in), STAGE_BATCH):
        n_decisions += len(jobs.process_batch(sig_in[i:i + STAGE_BATCH], time.time()))
    t_job = time.process_time() - t0
    if dead:
        raise RuntimeError(f"{len(dead)} bench records dead-lettered, first: {dead[0][1]}")
    states = [st for p in jobs.parts.values() for st in p.cache.values()]
    sizes = [len(orjson.dumps(st.to_dict())) for st in states]
    t0 = time.process_time()
    n = 0
    for st in states * 20:
        JobState.from_dict(orjson.loads(orjson.dumps(st.to_dict())))
        n += 1
    t_rt = (time.process_time() - t0) / max(1, n)
    n_signals = jobs.metrics.jobs_signals
    return {"engine": getattr(live.matcher, "engine", ""), "signals": n_signals,
            "bundles": len(signals_recs), "decisions": n_decisions,
            "match_stage_cpu_s": round(t_match, 2),
            "match_stage_lines_per_s": round(lines_total / t_match),
            "job_stage_cpu_s": round(t_job, 2),
            "job_stage_signals_per_s": round(n_signals / t_job),
            "job_stage_table_writes": jobs.metrics.extra.get("table_writes", 0),
            "both_stages_lines_per_s": round(lines_total / (t_match + t_job)),
            "avg_jobstate_bytes": round(sum(sizes) / max(1, len(sizes))),
            "jobstate_roundtrip_us": round(t_rt * 1e6, 1)}


class Workers:
    """Several processor workers of one group, read as one (CPU summed, alive if all are)."""

    def __init__(self, procs: list[Any]) -> None:
        self.procs = procs
        self.pid = procs[0].pid

    def cpu_s(self) -> float | None:
        cpus = [proc_cpu_s(p.pid) for p in self.procs]
        return None if any(c is None for c in cpus) else sum(c for c in cpus if c is not None)

    def poll(self) -> int | None:
        codes = [p.poll() for p in self.procs]
        return next((c for c in codes if c is not None), None)


async def processor_run(a: argparse.Namespace, prefix: str, topics: Topics,
                        total_lines: int, workers: int = 1,
                        fill_after: Callable[[], Awaitable[Any]] | None = None
                        ) -> dict[str, Any]:
    """Start `workers` processors of one group and time them until the logs (then the
    signals they made) are consumed. `fill_after`: the topic is empty at the start and this
    fills it once every worker holds its partitions (the time counts from there); without
    it the topic was filled before (a second worker joining late would find it read)."""
    workdir = Path(a.workdir)
    workdir.mkdir(parents=True, exist_ok=True)
    plog = workdir / f"tp-processor-{prefix.strip('.')}.log"
    watcher = GroupWatcher(a.bootstrap, f"{prefix}processor", [topics.logs, topics.signals])
    await watcher.start()
    t_launch = time.time()
    procs = []
    for k in range(workers):  # one group: the partitions are shared among them
        p, launcher = start_processor(a.bootstrap, prefix, a.partitions, 300.0, 1.0,
                                      plog.with_suffix(f".{k}.log") if k else plog, a.launcher)
        procs.append(p)
    proc = Workers(procs)
    bpid = broker_pid(int(a.bootstrap.rsplit(":", 1)[1]))
    spy = None
    t_stable = t_first = t_logs = t_sig = None
    cpu_at: dict[str, float | None] = {}
    series = []
    try:
        while time.time() - t_launch < a.timeout_s:
            s = await watcher.sample()
            now = time.time()
            if t_stable is None:
                st = await watcher.group_state()
                if "Stable" in st and (workers == 1 or await _members(watcher) >= workers):
                    t_stable = now
                    cpu_at["stable"] = proc.cpu_s()
                    cpu_at["broker_stable"] = proc_cpu_s(bpid) if bpid else None
                    if fill_after is not None:
                        await fill_after()
                    if a.py_spy:
                        spy = subprocess.Popen(
                            [str(Path(sys.executable).parent / "py-spy"), "record", "-p",
                             str(proc.pid), "-o", a.py_spy, "--format", "raw", "-r", "50",
                             "-d", str(int(a.py_spy_s))],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            committed = sum(c for _, c in s.get(topics.logs, {}).values())
            if t_first is None and committed > 0:
                t_first = now
            lag_logs = lag_of(s, topics.logs)
            series.append([round(now - t_launch, 1), lag_logs, lag_of(s, topics.signals)])
            if t_logs is None and committed > 0 and lag_logs == 0:
                t_logs = now
                cpu_at["logs_done"] = proc.cpu_s()
                cpu_at["broker_logs_done"] = proc_cpu_s(bpid) if bpid else None
            # ticks keep adding a few records to signals; "caught up" = at most 2 per partition
            if t_logs is not None and lag_of(s, topics.signals) <= 2 * a.partitions:
                t_sig = now
                break
            if proc.poll() is not None:
                raise RuntimeError(f"processor exited: {plog.read_text()[-2000:]}")
            await asyncio.sleep(a.poll_s)
    finally:
        if spy is not None:
            spy.send_signal(2)
            try:
                spy.wait(30)
            except subprocess.TimeoutExpired:
                spy.kill()
        for p in procs:
            stop_processor(p)
        await watcher.stop()
    out: dict[str, Any] = {"launcher": launcher, "log": str(plog), "workers": workers}
    if t_stable is None or t_logs is None:
        out["error"] = "did not finish within --timeout-s"
        out["lag_series"] = series[-10:]
        return out
    consume_s = t_logs - t_stable
    out.update({
        "startup_to_stable_s": round(t_stable - t_launch, 2),
        "logs_done_after_stable_s": round(consume_s, 2),
        "signals_done_after_stable_s": round((t_sig or t_logs) - t_stable, 2),
        "lines_per_s": round(total_lines / consume_s),
        "lines_per_s_both_stages_done": round(total_lines / ((t_sig or t_logs) - t_stable)),
        "lines_per_cpu_s": (round(total_lines / (cpu_at["logs_done"] - cpu_at["stable"]))
                            if cpu_at.get("logs_done") is not None
                            and cpu_at.get("stable") is not None
                            and cpu_at["logs_done"] > cpu_at["stable"] else None),
        "cpu_pct_while_consuming": (round(100 * (cpu_at["logs_done"] - cpu_at["stable"])
                                          / consume_s, 1)
                                    if cpu_at.get("logs_done") is not None
                                    and cpu_at.get("stable") is not None else None),
        "broker_cpu_pct_while_consuming": (
            round(100 * (cpu_at["broker_logs_done"] - cpu_at["broker_stable"]) / consume_s, 1)
            if cpu_at.get("broker_logs_done") is not None
            and cpu_at.get("broker_stable") is not None else None),
        "note": "committed offsets are sampled every poll_s and committed every 1 s by Faust",
        "lag_series_cols": ["t_since_launch_s", "logs_lag_records", "signals_lag_records"],
        "lag_series": series[:: max(1, len(series) // 20)],
    })
    return out


async def _members(watcher: GroupWatcher) -> int:
    """How many members the watched group has (0 when it cannot be described)."""
    try:
        desc = await watcher.admin.describe_consumer_groups([watcher.group])
        groups = getattr(desc[0], "groups", None)
        return len(groups[0][5]) if groups else 0  # (error, id, state, type, protocol, members)
    except Exception:  # noqa: BLE001 - an admin client without the call, a transient error
        return 0


# where a py-spy sample belongs, first match wins: (part, any of these in its stack)
SPY_PARTS = (
    ("idle (epoll wait)", ("EpollSelector.select",)),
    ("core: line matching (signals_of_record)", ("signals_of_record",)),
    ("core: logs record decode (wire.decode_logs)", ("decode_logs",)),
    ("core: job state apply/tick", ("apply (faultwatch/core", "tick (faultwatch/core")),
    ("core: signals decode (wire.decode_signals)", ("decode_signals",)),
    ("stage glue (matcher_stage/job_stage rest)", ("MatcherStage.", "JobStage.")),
    ("shell: agents' own code (faust_app)", ("faust_app.py",)),
    ("consumer thread (aiokafka fetch/decode)", ("Thread._bootstrap",)),
)


def spy_breakdown(stacks: list[tuple[str, int]]) -> list[list[Any]]:
    """Sample shares by part of the worker (SPY_PARTS, the rest is Faust, aiokafka and
    asyncio plumbing on the main thread)."""
    parts: Counter[str] = Counter()
    total = sum(n for _, n in stacks)
    for stack, n in stacks:
        part = next((name for name, marks in SPY_PARTS if any(m in stack for m in marks)),
                    "shell: Faust/aiokafka/asyncio plumbing (main thread)")
        parts[part] += n
    return [[round(100 * v / max(1, total), 1), k] for k, v in parts.most_common()]


def summarize_spy(path: str, top: int = 25) -> dict[str, Any]:
    """Self and inclusive sample shares per function from a py-spy raw (collapsed) file,
    and the shares by part of the worker."""
    stacks: list[tuple[str, int]] = []
    self_c: Counter[str] = Counter()
    incl: Counter[str] = Counter()
    total = 0
    try:
        text = Path(path).read_text()
    except OSError:
        return {"error": f"no profile at {path}"}
    for ln in text.splitlines():
        stack, _, n = ln.rpartition(" ")
        if not stack or not n.isdigit():
            continue
        c = int(n)
        stacks.append((stack, c))
        total += c
        frames = stack.split(";")
        self_c[frames[-1]] += c
        for f in set(frames):
            incl[f] += c
    if not total:
        return {"error": "empty profile"}
    def fmt(cn: Counter[str]) -> list[list[Any]]:
        return [[round(100 * v / total, 1), k[:140]] for k, v in cn.most_common(top)]
    return {"samples": total, "breakdown_pct": spy_breakdown(stacks),
            "self_pct": fmt(self_c), "inclusive_pct": fmt(incl)}


def cost_split(out: dict[str, Any], peer_lpc: float) -> dict[str, Any]:
    """CPU µs per logs record: the peer's, the processor's, its two stages' in process
    (the core), and the rest (the shell: Faust, aiokafka, asyncio, sends, timers)."""
    records = out["records"]
    plc = out["processor"].get("lines_per_cpu_s")
    core = out.get("core_in_process")
    if not plc:
        return {}
    per_rec = 1e6 * out["lines"] / records
    res = {"peer_cpu_us_per_record": round(per_rec / peer_lpc, 1),
           "processor_cpu_us_per_record": round(per_rec / plc, 1)}
    if core:
        core_us = 1e6 * (core["match_stage_cpu_s"] + core["job_stage_cpu_s"]) / records
        res["core_cpu_us_per_record"] = round(core_us, 1)
        res["shell_cpu_us_per_record"] = round(per_rec / plc - core_us, 1)
        # what the ratio would be with the shell as it is and a free core (the shell's bound)
        res["processor_over_peer_per_cpu_s_without_core"] = round(
            (per_rec / peer_lpc) / max(1e-9, per_rec / plc - core_us), 3)
    return res


async def main_async(a: argparse.Namespace) -> dict[str, Any]:
    prefix = a.topic_prefix or f"bench.tp.{int(time.time())}."
    topics = Topics(prefix)
    await ensure_topics(a.bootstrap, topics, a.partitions)
    t0 = time.time()
    recs, total_lines = make_records(a)
    gen_s = time.time() - t0
    out: dict[str, Any] = {"config": vars(a), "topic_prefix": prefix,
                           "records": len(recs), "lines": total_lines,
                           "record_bytes_avg": round(sum(len(v) for _, v in recs) / len(recs)),
                           "encode_s": round(gen_s, 2)}
    out["fill"] = await fill(a, topics.logs, recs)
    line_records = sum(1 for _, v in recs if b'"t":"lines"' in v[:40])
    out["line_records"] = line_records
    out["peer_aiokafka_orjson"] = await peer(a, topics.logs, len(recs))
    if not a.skip_core:
        out["core_in_process"] = core_stages(recs, total_lines, a.partitions)
    del recs
    out["processor"] = await processor_run(a, prefix, topics, total_lines)
    if a.py_spy:
        out["processor_profile"] = summarize_spy(a.py_spy)
    # the peer once more after the processor: on a shared machine the load changes between
    # the two, so the ratio uses the mean of the peer's runs on either side
    out["peer_after_processor"] = await peer(a, topics.logs, out["records"])
    peers = [out["peer_aiokafka_orjson"], out["peer_after_processor"]]
    peer_lps = sum(p["lines_per_s"] for p in peers) / len(peers)
    peer_lpc = sum(p["lines_per_cpu_s"] for p in peers) / len(peers)
    pl = out["processor"].get("lines_per_s")
    plc = out["processor"].get("lines_per_cpu_s")
    out["summary"] = {
        "peer_lines_per_s": round(peer_lps),
        "processor_lines_per_s": pl,
        "processor_over_peer": round(pl / peer_lps, 4) if pl else None,
        # the same ratio per CPU second: what each would do on a core of its own (the
        # machine is shared, so the wall-clock ratio depends on what else runs meanwhile)
        "peer_lines_per_cpu_s": round(peer_lpc),
        "processor_lines_per_cpu_s": plc,
        "processor_over_peer_per_cpu_s": round(plc / peer_lpc, 4) if plc else None,
    }
    out["summary"].update(cost_split(out, peer_lpc))
    if a.scale_out:  # the same records read by 1 and by 2 workers of one group, each afresh
        runs = []
        for n in (1, 2):
            pre = f"{prefix}s{n}."
            tps = Topics(pre)
            await ensure_topics(a.bootstrap, tps, a.partitions)
            recs_n = make_records(a)[0]
            # filled once every worker holds its partitions: filled before, the first
            # worker read it all before a second one joined (2026-12-08)
            r = await processor_run(a, pre, tps, total_lines, workers=n,
                                    fill_after=partial(fill, a, tps.logs, recs_n))
            runs.append({"workers": n, **{k: r.get(k) for k in (
                "lines_per_s", "lines_per_cpu_s", "cpu_pct_while_consuming",
                "logs_done_after_stable_s", "error")}})
        one, two = runs
        out["scale_out"] = {
            "runs": runs, "loadavg": os.getloadavg(),
            "wall_ratio_2_over_1": round(two["lines_per_s"] / one["lines_per_s"], 3)
            if one.get("lines_per_s") and two.get("lines_per_s") else None,
            # CPU per line with two workers vs one: 1.0 means the second worker adds no
            # cost per line (it scales with cores where the cores exist)
            "cpu_per_line_ratio_2_over_1": round(one["lines_per_cpu_s"] / two["lines_per_cpu_s"],
                                                 3)
            if one.get("lines_per_cpu_s") and two.get("lines_per_cpu_s") else None}
    prof = out.get("processor_profile", {})
    if "breakdown_pct" in prof:  # where the processor's time goes, by part and function
        out["summary"]["profile_parts_pct"] = prof["breakdown_pct"]
        out["summary"]["profile_top_self_pct"] = prof["self_pct"][:10]
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--bootstrap", default="127.0.0.1:29092")
    p.add_argument("--topic-prefix", default="")
    p.add_argument("--partitions", type=int, default=4)
    p.add_argument("--lines", type=int, default=200_000)
    p.add_argument("--lines-per-record", type=int, default=100)
    p.add_argument("--jobs", type=int, default=100)
    p.add_argument("--nodes-per-job", type=int, default=4)
    p.add_argument("--hb-every", type=int, default=10, help="a heartbeat every N line records "
                                                             "per node (0: none)")
    p.add_argument("--timeout-s", type=float, default=900.0)
    p.add_argument("--poll-s", type=float, default=0.5)
    p.add_argument("--launcher", choices=["auto", "cli", "fallback"], default="auto")
    p.add_argument("--skip-core", action="store_true")
    p.add_argument("--py-spy", default="", help="write a py-spy raw profile of the processor here")
    p.add_argument("--py-spy-s", type=float, default=60.0)
    p.add_argument("--workdir", default="/tmp/fleetbench")
    p.add_argument("--seed", type=int, default=11)
    p.add_argument("--out", default="")
    p.add_argument("--scale-out", action="store_true",
                   help="also 1 then 2 workers of one group on fresh copies of the records")
    a = p.parse_args()
    res = asyncio.run(main_async(a))
    s = orjson.dumps(res, option=orjson.OPT_INDENT_2).decode()
    import re
    s = re.sub(r"\[\s+(-?[\d.]+(?:,\s+-?[\d.]+)*)\s+\]",
               lambda m: "[" + ", ".join(m.group(1).split()).replace(",,", ",") + "]", s)
    s = re.sub(r"\[\s+(-?[\d.]+),\s+(\"[^\"\n]*\")\s+\]", r"[\1, \2]", s)
    if a.out:
        Path(a.out).write_text(s)
    print(s)


if __name__ == "__main__":
    main()
