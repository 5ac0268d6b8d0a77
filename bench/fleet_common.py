"""Shared pieces of the fleet benchmarks: processor launcher, lag sampling, CPU accounting.

Also runnable as a fallback processor launcher (used when `python -m faultwatch process`
does not start, e.g. while the CLI is being edited):

    python bench/fleet_common.py --launch-processor BOOTSTRAP PREFIX PARTITIONS HANG_S SETTLE_S
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
CLK_TCK = os.sysconf("SC_CLK_TCK")


def percentile(xs: list[float], p: float) -> float | None:
    """Nearest-rank percentile (p in 0..100), None for an empty list."""
    if not xs:
        return None
    s = sorted(xs)
    k = max(0, min(len(s) - 1, int(round(p / 100.0 * len(s) + 0.5)) - 1))
    return round(s[k], 3)


def proc_cpu_s(pid: int) -> float | None:
    """User+system CPU seconds of a process (Linux /proc), None if it is gone."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            parts = f.read().rsplit(")", 1)[1].split()
        return (int(parts[11]) + int(parts[12])) / CLK_TCK
    except (OSError, IndexError, ValueError):
        return None


def self_cpu_s() -> float:
    t = os.times()
    return t.user + t.system


def broker_pid(port: int) -> int | None:
    """The pid of the local Kafka broker listening on `port` (best effort, for CPU figures)."""
    try:
        out = subprocess.run(["bash", "-c", f"ss -ltnpH 'sport = :{port}'"], capture_output=True,
                             text=True, timeout=5).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    import re
    m = re.search(r"pid=(\d+)", out)
    return int(m.group(1)) if m else None


def start_processor(bootstrap: str, prefix: str, partitions: int, hang_window_s: float,
                    settle_s: float, log_path: Path, launcher: str = "auto",
                    extra: list[str] | None = None) -> tuple[subprocess.Popen[bytes], str]:
    """Start one processor worker; `launcher` is cli, fallback or auto (cli, else fallback)."""
    py = sys.executable
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    cli = [py, "-m", "faultwatch", "process", "--bootstrap", bootstrap, "--topic-prefix", prefix,
           "--partitions", str(partitions), "--hang-window-s", str(hang_window_s),
           "--settle-s", str(settle_s), *(extra or [])]
    fb = [py, str(Path(__file__).resolve()), "--launch-processor", bootstrap, prefix,
          str(partitions), str(hang_window_s), str(settle_s)]
    order = {"cli": [("cli", cli)], "fallback": [("fallback", fb)],
             "auto": [("cli", cli), ("fallback", fb)]}[launcher]
    last_err = ""
    for name, cmd in order:
        logf = open(log_path, "ab")
        p = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=logf, stderr=subprocess.STDOUT)
        time.sleep(3.0)
        if p.poll() is None:
            return p, name
        last_err = log_path.read_text(errors="replace")[-2000:]
    raise RuntimeError(f"processor did not start:\n{last_err}")


def stop_processor(p: subprocess.Popen[bytes], timeout_s: float = 15.0) -> None:
    if p.poll() is not None:
        return
    p.terminate()
    try:
        p.wait(timeout_s)
    except subprocess.TimeoutExpired:
        p.kill()
        p.wait(5)


class GroupWatcher:
    """End offsets of topics vs a consumer group's committed offsets (its lag)."""

    def __init__(self, bootstrap: str, group: str, topics: list[str]):
        self.bootstrap, self.group, self.topics = bootstrap, group, topics
        self.admin: Any = None
        self.consumer: Any = None
        self.tps: list[Any] = []

    async def start(self) -> None:
        from aiokafka import AIOKafkaConsumer, TopicPartition
        from aiokafka.admin import AIOKafkaAdminClient
        self.admin = AIOKafkaAdminClient(bootstrap_servers=self.bootstrap)
        await self.admin.start()
        self.consumer = AIOKafkaConsumer(bootstrap_servers=self.bootstrap, enable_auto_commit=False)
        await self.consumer.start()
        for t in self.topics:
            parts: set[int] | None = None
            for _ in range(50):
                parts = self.consumer.partitions_for_topic(t)
                if parts:
                    break
                await self.consumer._client.force_metadata_update()  # noqa: SLF001
                await asyncio.sleep(0.2)
            self.tps += [TopicPartition(t, p) for p in sorted(parts or ())]

    async def sample(self) -> dict[str, dict[int, tuple[int, int]]]:
        """{topic: {partition: (end_offset, committed_offset)}} (committed 0 when none)."""
        ends = await self.consumer.end_offsets(self.tps)
        try:
            committed = await self.admin.list_consumer_group_offsets(self.group)
        except Exception:  # noqa: BLE001 - group not there yet
            committed = {}
        out: dict[str, dict[int, tuple[int, int]]] = {}
        for tp in self.tps:
            c = committed.get(tp)
            off = c.offset if c is not None and c.offset >= 0 else 0
            out.setdefault(tp.topic, {})[tp.partition] = (ends[tp], off)
        return out

    async def group_state(self) -> str:
        try:
            d = await self.admin.describe_consumer_groups([self.group])
            g = d[0]
            groups = getattr(g, "groups", None)
            if groups:
                return str(groups[0][2])
            return str(g)
        except Exception as e:  # noqa: BLE001
            return f"?{e!r}"

    async def stop(self) -> None:
        if self.consumer is not None:
            await self.consumer.stop()
        if self.admin is not None:
            await self.admin.close()


def lag_of(sample: dict[str, dict[int, tuple[int, int]]], topic: str) -> int:
    return sum(max(0, e - c) for e, c in sample.get(topic, {}).values())


def _launch_processor(argv: list[str]) -> None:
    """The fallback launcher (adapted from /tmp/proc.py), bypassing faultwatch.cli."""
    bootstrap, prefix, partitions, hang_s, settle_s = argv
    from faust.worker import Worker

    from faultwatch.core.policy import policy_for
    from faultwatch.kafka.admin import ensure_topics
    from faultwatch.rules import load_ruleset
    from faultwatch.streams import gcsettings
    from faultwatch.streams.app import ProcessorConfig, build_app
    from faultwatch.wire.topics import Topics
    rs = load_ruleset([])
    pol = policy_for(rs.policy, {"hang_window_s": float(hang_s), "settle_s": float(settle_s)})
    asyncio.run(ensure_topics(bootstrap, Topics(prefix), int(partitions)))
    asyncio.set_event_loop(asyncio.new_event_loop())
    app = build_app(ProcessorConfig(bootstrap=bootstrap, ruleset=rs, policy=pol,
                                    topics=Topics(prefix), partitions=int(partitions)))
    gcsettings.tune()  # as streams/worker.run_worker does
    Worker(app, loglevel="warning", quiet=True).execute_from_commandline()


if __name__ == "__main__":
    if len(sys.argv) == 7 and sys.argv[1] == "--launch-processor":
        _launch_processor(sys.argv[2:])
    else:
        print(__doc__)
        sys.exit(2)
