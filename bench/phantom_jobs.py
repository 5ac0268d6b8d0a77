"""Processor RSS per phantom job (issue 35 item 7): a real `faultwatch process` worker reads
--jobs one-record jobs (a run-start each, nothing else: the flood of issue 35 item 3) and
its resident set is read from /proc before, once they are all processed, once they are
decided (node-lost) and once they have left its table (FAULTWATCH_FINISHED_TTL_S). The
peer, in the same run and through the same worker: as many records of ONE job (heartbeats),
so what the Kafka clients and Faust hold for the records themselves is told apart from what
the table holds per job.

    .venv/bin/faultwatch kafka up --port 29092 &
    .venv/bin/python bench/phantom_jobs.py --bootstrap 127.0.0.1:29092 --jobs 10000

The quota on new jobs per node is switched off here (FAULTWATCH_NODE_NEW_JOBS_PER_MIN=0):
this measures what a table full of phantoms costs, which a fleet of many nodes can still
reach. Prints one JSON object.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import sys
import time
import uuid
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from fleet_common import GroupWatcher, lag_of, start_processor, stop_processor  # noqa: E402

from faultwatch import wire  # noqa: E402
from faultwatch.core.events import Heartbeat, RunStart  # noqa: E402


def rss_kb(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    return 0


async def produce(bootstrap: str, topic: str, records: list[tuple[bytes, bytes]]) -> None:
    from aiokafka import AIOKafkaProducer

    p = AIOKafkaProducer(bootstrap_servers=bootstrap, linger_ms=20, acks=1)
    await p.start()
    try:
        futs = [await p.send(topic, v, key=k) for k, v in records]
        await asyncio.gather(*futs)
    finally:
        await p.stop()


async def drained(bootstrap: str, group: str, topics: list[str], timeout_s: float) -> float:
    """Seconds until the group committed every record now on `topics` (the signals topic's
    ticks keep arriving: its end is taken when the wait starts)."""
    w = GroupWatcher(bootstrap, group, topics)
    await w.start()
    t0 = time.monotonic()
    try:
        target = {t: {p: e for p, (e, _) in parts.items()}
                  for t, parts in (await w.sample()).items()}
        while time.monotonic() - t0 < timeout_s:
            s = await w.sample()
            if all(s[t][p][1] >= e for t, parts in target.items() for p, e in parts.items()):
                return time.monotonic() - t0
            await asyncio.sleep(1.0)
        raise TimeoutError(f"not drained in {timeout_s}s: lag {lag_of(s, topics[0])}")
    finally:
        await w.stop()


def settle(pid: int, s: float = 5.0) -> int:
    time.sleep(s)
    return rss_kb(pid)


def _fields(line: str) -> dict[str, str]:
    return dict(re.findall(r"(\w+)=(\S+)", line))


def _last(text: str, field: str) -> int:
    """`field` of the last processor_metrics line."""
    lines = [ln for ln in text.splitlines() if "event=processor_metrics" in ln]
    return int(_fields(lines[-1]).get(field, 0)) if lines else 0


def _total(text: str, event: str, field: str) -> int:
    return sum(int(_fields(ln).get(field, 0)) for ln in text.splitlines()
               if f"event={event} " in ln)


def wait_log(log: Path, done: Any, timeout_s: float) -> float:
    """Seconds until `done(log text)` holds (TimeoutError after `timeout_s`)."""
    t0 = time.monotonic()
    while not done(log.read_text(errors="replace")):
        if time.monotonic() - t0 > timeout_s:
            raise TimeoutError(f"{log}: not done in {timeout_s}s")
        time.sleep(1.0)
    return time.monotonic() - t0


def run(bootstrap: str, jobs: int, partitions: int, node_lost_s: float, ttl_s: float,
        timeout_s: float) -> dict[str, Any]:
    prefix = f"phantom{uuid.uuid4().hex[:6]}."
    logs, signals = f"{prefix}logs", f"{prefix}signals"
    group = f"{prefix}processor"
    os.environ.update(FAULTWATCH_NODE_NEW_JOBS_PER_MIN="0", FAULTWATCH_NODE_RUN_STARTS_PER_MIN="0",
                      FAULTWATCH_FINISHED_TTL_S=str(ttl_s), FAULTWATCH_MAX_JOBS=str(jobs * 2))
    log = Path(f"/tmp/{prefix}processor.log")
    proc, _ = start_processor(bootstrap, prefix, partitions, 3600.0, 1.0, log,
                              extra=["--node-lost-s", str(node_lost_s)])
    out: dict[str, Any] = {"jobs": jobs, "partitions": partitions, "node_lost_s": node_lost_s,
                           "finished_ttl_s": ttl_s, "log": str(log)}
    try:
        t0 = time.monotonic()
        while "event=partitions_assigned" not in log.read_text(errors="replace"):
            if proc.poll() is not None or time.monotonic() - t0 > timeout_s:
                raise RuntimeError("the processor did not start:\n"
                                   + log.read_text(errors="replace")[-3000:])
            time.sleep(0.5)
        t = time.time()
        warm = [(wire.log_key("warm", "w0"), wire.encode_run_start(RunStart("warm", 0, "w0", t)))]
        asyncio.run(produce(bootstrap, logs, warm))
        asyncio.run(drained(bootstrap, group, [logs, signals], timeout_s))
        base = settle(proc.pid)
        # the peer: as many records, all heartbeats of the one warm job
        beats = [(wire.log_key("warm", "w0"), wire.encode_heartbeat(
            Heartbeat("warm", 0, "w0", t + i * 1e-3, True, t, t))) for i in range(jobs)]
        asyncio.run(produce(bootstrap, logs, beats))
        asyncio.run(drained(bootstrap, group, [logs, signals], timeout_s))
        peer = settle(proc.pid)
        t = time.time()
        flood = [(wire.log_key(f"ph{i:06d}", "nodeA"), wire.encode_run_start(
            RunStart(f"ph{i:06d}", 0, "nodeA", t, run_id=f"r{i}", world_size=8, rank=0)))
            for i in range(jobs)]
        t0 = time.monotonic()
        asyncio.run(produce(bootstrap, logs, flood))
        asyncio.run(drained(bootstrap, group, [logs, signals], timeout_s))
        out["flood_s"] = round(time.monotonic() - t0, 1)
        held = settle(proc.pid)
        # node-lost for each (one node: the guard holds nothing), then past the TTL
        t_dec = wait_log(log, lambda text: _last(text, "decisions") >= jobs, timeout_s)
        decided = settle(proc.pid)
        t_exp = wait_log(log, lambda text: _total(text, "jobs_expired", "jobs") >= jobs,
                         timeout_s)
        expired = settle(proc.pid, 15.0)  # a release of the freed memory comes within 10 s
        out.update({"decided_after_s": round(t_dec, 1), "expired_after_s": round(t_exp, 1)})
        text = log.read_text(errors="replace")
        out.update({
            "rss_mb": {"base": round(base / 1024, 1), "after_peer": round(peer / 1024, 1),
                       "jobs_held": round(held / 1024, 1), "decided": round(decided / 1024, 1),
                       "expired": round(expired / 1024, 1)},
            "peer_bytes_per_record": round((peer - base) * 1024 / jobs),
            "bytes_per_job": {"held": round((held - peer) * 1024 / jobs),
                              "decided": round((decided - peer) * 1024 / jobs),
                              "after_expiry": round((expired - peer) * 1024 / jobs)},
            "jobs_expired_lines": text.count("event=jobs_expired"),
        })
    finally:
        stop_processor(proc)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--bootstrap", required=True)
    ap.add_argument("--jobs", type=int, default=10_000)
    ap.add_argument("--partitions", type=int, default=4)
    ap.add_argument("--node-lost-s", type=float, default=20.0)
    ap.add_argument("--finished-ttl-s", type=float, default=60.0)
    ap.add_argument("--timeout-s", type=float, default=900.0)
    a = ap.parse_args()
    print(json.dumps(run(a.bootstrap, a.jobs, a.partitions, a.node_lost_s, a.finished_ttl_s,
                         a.timeout_s)))


if __name__ == "__main__":
    main()
