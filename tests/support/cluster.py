"""Cluster-mode harness: a real `faultwatch process` worker, agents, decisions and logs on Kafka."""

from __future__ import annotations

import json
import re
import subprocess
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from tests.support.processes import faultwatch_exe, job_env, stop_group
from tests.support.waiting import wait_until


@contextmanager
def processor(bootstrap: str, prefix: str, log: Path, *flags: str,
              env: dict[str, str] | None = None) -> Iterator[subprocess.Popen[bytes]]:
    """A `faultwatch process` worker; stopped with SIGTERM (then SIGKILL) at the end.
    `--partitions 2` unless the flags say otherwise; `env` adds environment variables."""
    with open(log, "wb") as out:
        proc = subprocess.Popen([faultwatch_exe(), "process", "--bootstrap", bootstrap,
                                 "--topic-prefix", prefix, "--partitions", "2", *flags],
                                stdout=out, stderr=subprocess.STDOUT,
                                env=job_env(**(env or {})), start_new_session=True)
    try:
        yield proc
    finally:
        stop_group(proc)


def events(log: Path, name: str) -> list[dict[str, str]]:
    """The structured `event=<name>` lines of a processor log, as dicts of their fields."""
    out = []
    text = log.read_text(errors="replace") if log.exists() else ""
    for line in text.splitlines():
        at = line.find("ts=")
        if at < 0 or f"event={name} " not in line + " ":
            continue
        out.append(dict(re.findall(r'(\w+)=("(?:[^"\\]|\\.)*"|\S+)', line[at:])))
    return out


def wait_event(log: Path, name: str, timeout_s: float = 60.0,
               where: Callable[[dict[str, str]], bool] = lambda e: True,
               proc: subprocess.Popen[bytes] | None = None) -> dict[str, str]:
    """The first `name` event of the log matching `where`, waiting up to `timeout_s` (and
    failing at once if `proc` exited without it)."""
    def tail() -> str:
        return log.read_text(errors="replace")[-3000:] if log.exists() else "(no log)"

    def found() -> dict[str, str] | None:
        hit = next((e for e in events(log, name) if where(e)), None)
        if hit is None and proc is not None and proc.poll() is not None:
            raise AssertionError(f"no {name} event in {log} (exited {proc.returncode}):\n"
                                 + tail())
        return hit

    return wait_until(found, timeout_s, f"a {name} event in {log}", detail=tail)


def refused_metric(log: Path) -> dict[tuple[str, str], float]:
    """`faultwatch_refused_total{what,reason}` scraped from the /metrics of the process whose
    log (`--metrics-port 0`) has its `metrics_listening` event: {(what, reason): count}."""
    import urllib.request

    addr = wait_event(log, "metrics_listening", 30)["address"].strip('"')
    with urllib.request.urlopen(f"http://{addr}/metrics", timeout=10) as r:
        text = r.read().decode()
    out = {}
    for labels, n in re.findall(r"^faultwatch_refused_total\{([^}]*)\} (\S+)$", text,
                                re.MULTILINE):
        lab = dict(re.findall(r'(\w+)="([^"]*)"', labels))
        out[(lab["what"], lab["reason"])] = float(n)
    return out


def metric_value(log: Path, name: str) -> float | None:
    """An unlabelled metric's value scraped from the /metrics of the process whose log
    (`--metrics-port 0`) has its `metrics_listening` event; None when it is not exported."""
    import urllib.request

    addr = wait_event(log, "metrics_listening", 30)["address"].strip('"')
    with urllib.request.urlopen(f"http://{addr}/metrics", timeout=10) as r:
        text = r.read().decode()
    m = re.search(rf"^{re.escape(name)} (\S+)$", text, re.MULTILINE)
    return float(m.group(1)) if m else None


def agent_cmd(bootstrap: str, prefix: str, job: str, node: str, cmd: list[str],
              *flags: str) -> list[str]:
    """The `faultwatch` executable's agent on `node`, heartbeats every second, shipping and
    exiting unless `flags` say more (agents.agent_cmd: the integration variant)."""
    return [faultwatch_exe(), "agent", "--bootstrap", bootstrap, "--topic-prefix", prefix,
            "--job", job, "--node", node, "--heartbeat-s", "1",
            "--no-follow-decisions", *flags, "--", *cmd]  # plain ship-and-exit unless flags say


def decisions(bootstrap: str, prefix: str, job: str, env: dict[str, str] | None = None
              ) -> list[dict[str, Any]]:
    """The job's decisions on the topic now, read with the real CLI (deduped by id), without
    the `diagnose` requests a silence raises before its hang decision (core/diagnosis.py);
    `env`: the reader's (a secured site's role)."""
    out = subprocess.run([faultwatch_exe(), "decisions", "--bootstrap", bootstrap,
                          "--topic-prefix", prefix, "--job", job, "--json"],
                         capture_output=True, text=True, timeout=60, env=env or job_env())
    if out.returncode == 7 and ("does not exist" in out.stderr  # NotFoundError: no topic
                                or "no decision of job" in out.stderr):  # nor job, yet
        return []
    assert out.returncode == 0, out.stderr
    got = [json.loads(x) for x in out.stdout.splitlines() if x.strip()]
    return [d for d in got if d["reason"]["kind"] != "diagnose"]


def wait_decisions(bootstrap: str, prefix: str, job: str, count: int = 1,
                   timeout_s: float = 60.0, env: dict[str, str] | None = None
                   ) -> list[dict[str, Any]]:
    """The job's decisions once there are `count`, or those there are after `timeout_s`
    (the caller asserts on them; a short count is also how "no second decision" is read)."""
    return wait_until(lambda: decisions(bootstrap, prefix, job, env), timeout_s,
                      f"{count} decision(s) of {job}", interval_s=1.0,
                      until=lambda got: len(got) >= count, raise_on_timeout=False)


async def _offsets(bootstrap: str, group: str, topic: str,
                   client: dict[str, Any] | None = None
                   ) -> tuple[dict[Any, int], dict[Any, int]]:
    """(end offset, offset committed by `group`) of every partition of `topic`; `client`:
    security settings (a secured site's admin role)."""
    from aiokafka import AIOKafkaConsumer, TopicPartition
    from aiokafka.admin import AIOKafkaAdminClient

    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap, **(client or {}))
    consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False,
                                **(client or {}))
    await admin.start()
    await consumer.start()
    try:
        described = await admin.describe_topics([topic])
        parts = [TopicPartition(topic, p["partition"])
                 for d in described for p in d.get("partitions", [])]
        ends = await consumer.end_offsets(parts) if parts else {}
        committed = {tp: max(0, m.offset) for tp, m in
                     (await admin.list_consumer_group_offsets(group)).items()
                     if tp.topic == topic}
        return dict(ends), committed
    finally:
        await consumer.stop()
        await admin.close()


def wait_processed(bootstrap: str, prefix: str, timeout_s: float = 90.0,
                   client: dict[str, Any] | None = None, group: str | None = None) -> None:
    """Positive control for a "no (further) decision" assertion: wait until the processor's
    consumer group has committed every record now on the logs topic, then every record then
    on the signals topic. A commit follows the delivery of what its records caused (signals,
    then decisions), so afterwards the decisions topic holds every decision of the records
    shipped so far: an empty answer means the processor decided nothing, not that it never
    read the job. (The signals topic also carries the processor's own ticks, so "caught up"
    is measured against the end offsets seen when the wait starts, not the moving end.)"""
    import asyncio


    group = group or f"{prefix}processor"
    for topic in (f"{prefix}logs", f"{prefix}signals"):
        target, _ = asyncio.run(_offsets(bootstrap, group, topic, client))
        assert target, f"no partitions of {topic}"

        def caught_up(topic: str = topic, target: dict[Any, int] = target) -> bool:
            _, done = asyncio.run(_offsets(bootstrap, group, topic, client))
            return all(done.get(tp, 0) >= end for tp, end in target.items())

        wait_until(caught_up, timeout_s, f"processor group {group} to commit {topic} up to "
                   f"{sorted(target.values())}", interval_s=0.5)


def wait_processor_ready(bootstrap: str, prefix: str, proc: subprocess.Popen[bytes],
                         log: Path, timeout_s: float = 90.0,
                         client: dict[str, Any] | None = None) -> None:
    """Wait until the processor's consumer group is Stable (the worker joined and holds its
    partitions), failing at once with its log if the worker died."""
    import asyncio

    from aiokafka.admin import AIOKafkaAdminClient


    async def state() -> str:
        from aiokafka.errors import KafkaError

        admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap, **(client or {}))
        await admin.start()
        try:
            groups = await admin.describe_consumer_groups([f"{prefix}processor"])
            return str(groups[0].groups[0][2]) if groups and groups[0].groups else ""
        except KafkaError:  # a fresh broker has no group coordinator yet: not ready
            return ""
        finally:
            await admin.close()

    def ready() -> bool:
        assert proc.poll() is None, f"processor died:\n{log.read_text()[-4000:]}"
        return asyncio.run(state()) == "Stable"

    wait_until(ready, timeout_s, f"processor group {prefix}processor to be Stable",
               interval_s=0.3)


def wait_log(log: Path, needle: str, timeout: float = 30.0) -> str:
    """The log's text once it contains `needle`."""
    return wait_until(lambda: log.read_text(errors="replace"), timeout,
                      f"{needle!r} in {log}", interval_s=0.3, until=lambda text: needle in text)


def fw_ok(bootstrap: str, prefix: str, *args: str) -> subprocess.CompletedProcess[str]:
    """`faultwatch ARGS` (the Kafka flags added to `nodes` commands), asserted to succeed."""
    res = subprocess.run([faultwatch_exe(), *args[:1], *(
        ["--bootstrap", bootstrap, "--topic-prefix", prefix] if args[0] == "nodes" else []),
        *args[1:]], capture_output=True, text=True, timeout=60, env=job_env())
    assert res.returncode == 0, res.stderr
    return res


def node_records(bootstrap: str, prefix: str) -> dict[str, dict[str, Any]]:
    """The node registry as `faultwatch nodes --json` prints it, by node."""
    out = fw_ok(bootstrap, prefix, "nodes", "--json").stdout
    return {d["node"]: d for d in map(json.loads, out.splitlines()) if d}
