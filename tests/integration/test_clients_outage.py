"""`faultwatch notify` and `faultwatch actuate` while their broker is away (issue 29 item 5,
"calm when the broker is away in every long-running process"): a broker of the test's own is
stopped under both for ~20 s; each uses little CPU, logs one line when the broker goes and one
when it is back (before: notify logged ~2,000 lines in 20 s, one per failed retry), stays up,
and acts again when the broker is back (positive controls: a decision posted and a quarantine
drained before and after the outage). The processor and the agent have tests of their own
(test_processor_outage.py, test_agent_follower.py)."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import time
import uuid
from pathlib import Path

import orjson
import pytest

from faultwatch.core.registry import NodeRecord, Reason
from faultwatch.kafka import broker as kafka_local
from faultwatch.kafka.admin import ensure_compacted_topic
from faultwatch.registry.store import write_records
from faultwatch.wire.topics import Topics
from tests.support.notify import Hook, dec, publish
from tests.support.processes import cpu_s, log_lines, stop_group
from tests.support.waiting import wait_until

pytestmark = [pytest.mark.slow, pytest.mark.kafka, pytest.mark.timeout(600)]

OUTAGE_S = 20.0
SETTLE_S = 5.0
CPU_SHARE_MAX = 0.25  # of one core, averaged over the outage
LINES_MAX = 60  # log lines during the outage


def _quarantined(node: str) -> NodeRecord:
    now = time.time()
    return NodeRecord(node=node, state="quarantined", until=now + 3600, strikes=1,
                      reasons=(Reason(ts=now, event="quarantine", decision=f"d-{node}",
                                      rule="xid-79", job="train"),), updated_ts=now)


def test_notify_and_actuate_are_calm_while_the_broker_is_down_and_recover(
        own_broker: tuple[str, Path, int], topic_prefix: str, tmp_path: Path) -> None:
    bootstrap, data, port = own_broker
    topics = Topics(topic_prefix)
    hook = Hook()
    drained = tmp_path / "drained.txt"
    env = dict(os.environ, FAULTWATCH_BOOTSTRAP=bootstrap, FAULTWATCH_TOPIC_PREFIX=topic_prefix,
               FAULTWATCH_WEBHOOKS=f"json={hook.url}")
    env.pop("FAULTWATCH_DECISION_KEY", None)
    asyncio.run(ensure_compacted_topic(bootstrap, topics.nodes))
    asyncio.run(publish(bootstrap, topics.decisions, [dec("before", 0)]))
    logs = {"notify": tmp_path / "notify.log", "actuate": tmp_path / "actuate.log"}
    tpl = orjson.dumps(["/bin/sh", "-c", 'echo "$1" >> "$0"', str(drained), "{node}"]).decode()
    argv = {"notify": ["notify", "--group-wait-s", "0.5", "--from-beginning",
                       "--group-id", f"g{uuid.uuid4().hex[:8]}"],
            "actuate": ["actuate", "--backend", "exec", "--exec-quarantine", tpl,
                        "--state-file", str(tmp_path / "state.jsonl")]}
    procs: dict[str, subprocess.Popen[bytes]] = {}
    try:
        for name, args in argv.items():
            with open(logs[name], "wb") as fh:
                procs[name] = subprocess.Popen([sys.executable, "-m", "faultwatch", *args],
                                               stdout=fh, stderr=subprocess.STDOUT, env=env,
                                               start_new_session=True)

        def drains() -> list[str]:
            return drained.read_text().split() if drained.exists() else []

        def posted(job: str) -> bool:
            return any(d["job"] == job for _, b in hook.accepted()
                       for d in b.get("decisions", []))

        def alive() -> str:
            return "".join(f"{n}: {logs[n].read_text()[-1500:]}" for n, p in procs.items()
                           if p.poll() is not None)

        # positive controls before the outage: both act
        wait_until(lambda: posted("before"), 120, "the decision posted before the outage",
                   detail=alive)
        wait_until(lambda: "actuate_started" in logs["actuate"].read_text(), 120,
                   "actuate started", detail=alive)
        asyncio.run(write_records(bootstrap, topics.nodes, [_quarantined("gpu-before")]))
        wait_until(lambda: drains() == ["gpu-before"], 60, "drained before", detail=alive)

        n0 = {n: log_lines(p) for n, p in logs.items()}
        kafka_local.down(data, port)
        time.sleep(SETTLE_S)
        cpu0 = {n: cpu_s(p.pid) for n, p in procs.items()}
        t0 = time.monotonic()
        time.sleep(OUTAGE_S)
        span = time.monotonic() - t0
        cpu = {n: (cpu_s(p.pid) - cpu0[n]) / span for n, p in procs.items()}
        logged = {n: log_lines(p) - n0[n] for n, p in logs.items()}
        kafka_local.up(port=port, data_dir=data)
        print(f"\nwhile the broker was down for {OUTAGE_S:.0f}s: " + ", ".join(
            f"{n} CPU {cpu[n] * 100:.1f}% of a core, {logged[n]} log lines" for n in procs))
        assert not alive(), alive()

        # positive controls after the outage: both act again
        asyncio.run(publish(bootstrap, topics.decisions, [dec("after", 1)]))
        asyncio.run(write_records(bootstrap, topics.nodes, [_quarantined("gpu-after")]))
        wait_until(lambda: posted("after"), 180, "the decision posted after the outage",
                   detail=alive)
        wait_until(lambda: drains() == ["gpu-before", "gpu-after"], 180, "drained after",
                   detail=alive)
        # one line when the outage starts, one when it is over (no errors for 15 s)
        wait_until(lambda: all("event=broker_reachable" in p.read_text() for p in logs.values()),
                   120, "broker_reachable logged by both", detail=alive)
    finally:
        for p in procs.values():
            stop_group(p, grace_s=30)
        hook.server.shutdown()
    for n in procs:
        text = logs[n].read_text(errors="replace")
        assert cpu[n] < CPU_SHARE_MAX, (n, cpu[n], text[-3000:])
        assert logged[n] <= LINES_MAX, (n, logged[n], text[-5000:])
        assert text.count("event=broker_unreachable ") == 1, (n, text[-5000:])
