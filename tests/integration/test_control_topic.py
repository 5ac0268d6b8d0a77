"""Decisions are decisions (issue 21 item 2): a silent job's diagnosis requests (probes) go to
<prefix>control, never to <prefix>decisions, and the agent still answers them (its ranks'
stacks arrive and the hang decision names the probes and what they found). A probe on the
decisions topic, as a processor older than the control topic sends it, is answered too.

Real broker, real `faultwatch process`, real `faultwatch agent`, real py-spy captures."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from faultwatch import wire
from faultwatch.core.events import Decision
from tests.support.cluster import events, processor, wait_event
from tests.support.processes import faultwatch_exe, job_env
from tests.support.waiting import wait_until

pytestmark = [pytest.mark.slow, pytest.mark.kafka]

WINDOW_S = 8.0
RULES = f"""\
version: 1
policy:
  settle_s: 0.5
  hang_window_s: {WINDOW_S}
  restart_backoff_s: 0.1
rules: []
"""
SILENT = "import time; print('step 1', flush=True); time.sleep(120)"
CHATTY = "import time\nfor i in range(300):\n    print('step', i, flush=True); time.sleep(0.5)\n"


async def _read(bootstrap: str, topic: str) -> list[tuple[bytes | None, bytes | None]]:
    """Every record now on the topic (key, value)."""
    from aiokafka import AIOKafkaConsumer, TopicPartition

    c = AIOKafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False)
    await c.start()
    try:
        parts = c.partitions_for_topic(topic) or set()
        if not parts:
            await c._client.force_metadata_update()  # noqa: SLF001
            parts = c.partitions_for_topic(topic) or set()
        tps = [TopicPartition(topic, p) for p in sorted(parts)]
        if not tps:
            return []
        c.assign(tps)
        await c.seek_to_beginning(*tps)
        ends = await c.end_offsets(tps)
        out: list[tuple[bytes | None, bytes | None]] = []
        async def behind() -> bool:
            return any([await c.position(tp) < ends[tp] for tp in tps])

        while await behind():
            for msgs in (await c.getmany(timeout_ms=500)).values():
                out.extend((m.key, m.value) for m in msgs)
        return out
    finally:
        await c.stop()


def records(bootstrap: str, topic: str, job: str) -> list[dict[str, Any]]:
    key = wire.job_key(job)
    return [wire.decision_to_dict(wire.decode_decision(v))
            for k, v in asyncio.run(_read(bootstrap, topic)) if k == key]


@pytest.fixture(scope="module")
def cluster(kafka_bootstrap: str, tmp_path_factory: pytest.TempPathFactory
            ) -> Iterator[tuple[str, str, Path]]:
    tmp = tmp_path_factory.mktemp("control")
    rules = tmp / "rules.yaml"
    rules.write_text(RULES)
    prefix = f"ctl{uuid.uuid4().hex[:8]}."
    log = tmp / "processor.log"
    # a processor_metrics line every 30 s: the module's last test times the first one
    with processor(kafka_bootstrap, prefix, log, "--rules", str(rules),
                   env={"FAULTWATCH_METRICS_LOG_S": "30"}) as proc:
        # caught up and assigned before a job starts: a processor starting late would see a
        # silence already past its window and decide at once, probes and hang together
        wait_event(log, "partitions_assigned", 180, proc=proc)
        yield kafka_bootstrap, prefix, tmp
        assert proc.poll() is None, f"processor died:\n{log.read_text()[-4000:]}"


def agent(bootstrap: str, prefix: str, tmp: Path, job: str, code: str, *flags: str
          ) -> subprocess.Popen[str]:
    err = open(tmp / f"{job}.err", "w")  # noqa: SIM115 - closed with the process
    return subprocess.Popen(
        [faultwatch_exe(), "agent", "--bootstrap", bootstrap, "--topic-prefix", prefix,
         "--job", job, "--node", f"n-{job}", "--heartbeat-s", "1", "--spool-dir",
         str(tmp / "spool"), "--follow-decisions", "--exit-flush-timeout-s", "5",
         "--verdict-out", str(tmp / f"{job}.verdict.json"), *flags, "--",
         sys.executable, "-c", code],
        env=job_env(RANK="0"), stdout=subprocess.DEVNULL, stderr=err, text=True)


def test_a_hangs_probes_go_to_the_control_topic_and_are_answered(
        cluster: tuple[str, str, Path]) -> None:
    bootstrap, prefix, tmp = cluster
    job = f"hang-{uuid.uuid4().hex[:6]}"
    p = agent(bootstrap, prefix, tmp, job, SILENT, "--on-restart", "exit")
    try:
        rc = p.wait(timeout=180)  # the hang's restart: exit 75 (--on-restart exit)
    finally:
        if p.poll() is None:
            p.kill()
            p.wait(10)
    err = tmp / f"{job}.err"
    assert rc == 75, err.read_text()[-4000:]
    decisions = records(bootstrap, f"{prefix}decisions", job)
    control = records(bootstrap, f"{prefix}control", job)
    # positive control: the hang decision is on the decisions topic ...
    hangs = [d for d in decisions if d["reason"]["kind"] == "hang"]
    assert len(hangs) == 1, decisions
    # ... and no probe is; the probes are all on the control topic
    assert [d for d in decisions if d["reason"]["kind"] == "diagnose"] == []
    assert control and all((d["action"], d["reason"]["kind"]) == ("notify", "diagnose")
                           for d in control), control
    # the agent answered them from the control topic: its rank's stack was captured
    probe_ids = {d["id"] for d in control}
    answered = [e for e in events(err, "probe") if e["id"] in probe_ids]
    assert answered and {e["via"] for e in answered} == {"control"}, err.read_text()[-3000:]
    sent = [e for e in events(err, "diagnosis_sent") if e["request"] in probe_ids]
    assert sent and all(int(e["ranks"]) == 1 for e in sent), err.read_text()[-3000:]
    # the hang's evidence names the probes and what they found (one message, not many)
    probes = hangs[0]["evidence"]["probes"]
    assert {s["id"] for s in probes["sent"]} <= probe_ids and probes["sent"]
    assert probes["answered"][f"n-{job}"]["ranks"] == 1
    assert "probe(s) of stacks during the silence" in hangs[0]["reason"]["message"]
    # the readers never show a probe: `faultwatch decisions` (positive control: the hang)
    out = subprocess.run([faultwatch_exe(), "decisions", "--bootstrap", bootstrap,
                          "--topic-prefix", prefix, "--job", job, "--json"],
                         capture_output=True, text=True, timeout=60, env=job_env())
    kinds = [json.loads(x)["reason"]["kind"] for x in out.stdout.splitlines() if x.strip()]
    assert "hang" in kinds and "diagnose" not in kinds, out.stdout


def test_a_probe_on_the_decisions_topic_from_an_older_processor_is_answered_once(
        cluster: tuple[str, str, Path]) -> None:
    """An older processor publishes its probes on the decisions topic (and a new one with
    --probes-on-decisions on both): the new agent answers it, once per request id."""
    from aiokafka import AIOKafkaProducer

    bootstrap, prefix, tmp = cluster
    job = f"legacy-{uuid.uuid4().hex[:6]}"
    p = agent(bootstrap, prefix, tmp, job, CHATTY, "--run-id", f"run-{job}")
    err = tmp / f"{job}.err"
    try:
        wait_until(lambda: events(err, "child_started"), 60, "the child to start")
        wait_until(lambda: [e for e in events(err, "decisions_following")
                            if e.get("topic", "").endswith("control")], 60, "both followers")
        probe = Decision(id=f"old-{uuid.uuid4().hex[:8]}", job=job, attempt=0,
                         action="notify", kind="diagnose", ts=time.time(),
                         message="an older processor's probe", evidence={},
                         run_id=f"run-{job}")  # a decision naming no run acts on none
        value = json.dumps(wire.decision_to_dict(probe)).encode()

        async def publish() -> None:
            prod = AIOKafkaProducer(bootstrap_servers=bootstrap)
            await prod.start()
            try:
                for topic in ("decisions", "control"):  # as with --probes-on-decisions
                    await prod.send_and_wait(f"{prefix}{topic}", value,
                                             key=wire.job_key(job))
            finally:
                await prod.stop()

        asyncio.run(publish())
        sent = wait_until(lambda: [e for e in events(err, "diagnosis_sent")
                                   if e["request"] == probe.id], 60, "the answer")
        assert int(sent[0]["ranks"]) == 1
        again = wait_until(lambda: [e for e in events(err, "probe_seen_again")
                                    if e["id"] == probe.id], 30, "the second copy")
    finally:
        p.terminate()
        p.wait(timeout=60)
    answered = [e for e in events(err, "probe") if e["id"] == probe.id]
    assert len(answered) == 1, answered  # the copy on the other topic was not answered again
    assert {answered[0]["via"], again[0]["via"]} == {"decisions", "control"}
    assert len([e for e in events(err, "diagnosis_sent") if e["request"] == probe.id]) == 1


def test_probes_on_decisions_publishes_each_probe_on_both_topics_for_older_agents(
        kafka_bootstrap: str, tmp_path: Path) -> None:
    """The upgrade aid (docs/decisions.md#upgrading): a processor run with
    `--probes-on-decisions` puts each probe on the decisions topic too, where an agent older
    than the control topic looks for it; a new agent answers each probe once, and the new
    `faultwatch decisions` still shows none of them."""
    rules = tmp_path / "rules.yaml"
    rules.write_text(RULES)
    prefix = f"ctlup{uuid.uuid4().hex[:8]}."
    log = tmp_path / "processor.log"
    with processor(kafka_bootstrap, prefix, log, "--rules", str(rules),
                   "--probes-on-decisions") as proc:
        wait_event(log, "partitions_assigned", 180, proc=proc)
        job = f"upg-{uuid.uuid4().hex[:6]}"
        p = agent(kafka_bootstrap, prefix, tmp_path, job, SILENT, "--on-restart", "exit")
        try:
            rc = p.wait(timeout=180)
        finally:
            if p.poll() is None:
                p.kill()
                p.wait(10)
        err = tmp_path / f"{job}.err"
        assert rc == 75, err.read_text()[-4000:]
        assert proc.poll() is None, log.read_text()[-3000:]
    decisions = records(kafka_bootstrap, f"{prefix}decisions", job)
    control = records(kafka_bootstrap, f"{prefix}control", job)
    assert [d for d in decisions if d["reason"]["kind"] == "hang"], decisions  # as always
    on_decisions = {d["id"] for d in decisions if d["reason"]["kind"] == "diagnose"}
    assert on_decisions and on_decisions == {d["id"] for d in control}, (decisions, control)
    answered = [e["id"] for e in events(err, "probe") if e["id"] in on_decisions]
    assert answered and len(answered) == len(set(answered)), err.read_text()[-3000:]
    assert {e["id"] for e in events(err, "probe_seen_again")} & on_decisions, \
        err.read_text()[-3000:]  # the second copy was seen, and skipped
    out = subprocess.run([faultwatch_exe(), "decisions", "--bootstrap", kafka_bootstrap,
                          "--topic-prefix", prefix, "--job", job, "--json"],
                         capture_output=True, text=True, timeout=60, env=job_env())
    kinds = [json.loads(x)["reason"]["kind"] for x in out.stdout.splitlines() if x.strip()]
    assert "hang" in kinds and "diagnose" not in kinds, out.stdout


def test_processor_metrics_is_one_line_per_interval_not_every_10_s(
        cluster: tuple[str, str, Path]) -> None:
    """`process` logged processor_metrics every 10 s at info (98 of 163 lines of a 20-minute
    log, issue 36 item 8): now one line per FAULTWATCH_METRICS_LOG_S (default 300 s; 30 s
    for this module's worker). The line still comes (positive control), and not before."""
    from datetime import datetime

    log = cluster[2] / "processor.log"

    def at(e: dict[str, str]) -> float:
        return datetime.strptime(e["ts"], "%Y-%m-%dT%H:%M:%SZ").timestamp()

    first = wait_event(log, "processor_metrics", 180)
    started = at(events(log, "processor_starting")[0])
    assert at(first) - started >= 29, (first, started)
    assert float(first["records"]) > 0  # it read the module's jobs
