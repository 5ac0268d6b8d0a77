"""`faultwatch logs`, `decisions` and `status` as a person and a script run them: real agents
ship a job's lines (two nodes on two partitions, one failing and relaunched on a restart
decision read from the decisions topic), then the real commands read them back through the
broker as subprocesses, checked for output and exit codes (issue 23)."""

from __future__ import annotations

import asyncio
import json
import os
import re
import subprocess
import sys
import threading
import time
import uuid
from typing import Any

import pytest

from faultwatch import wire
from faultwatch.core.events import Decision
from faultwatch.errors import EXIT_NOT_FOUND, EXIT_USAGE
from faultwatch.kafka.admin import ensure_topics
from faultwatch.readers.render import ROW_FIELDS
from faultwatch.wire.topics import DEFAULT_PARTITIONS, Topics, log_key
from tests.support.kafka import produce_records
from tests.support.waiting import wait_until

pytestmark = pytest.mark.kafka

RUN = "R7"
TICKS = 12
# Each node says it is ready, waits for the test's start time T0 (in the file GO), then
# prints a tick every 0.2 s from T0 (n2 0.1 s after n1), so their lines interleave in time;
# n1 also writes every other tick to stderr as torchrun's rank 1 would, fails on attempt 0
# and prints one line on attempt 1.
CHILD = """\
import os, sys, time
node, offset, go = sys.argv[1], float(sys.argv[2]), sys.argv[4]
if os.environ.get("FAULTWATCH_ATTEMPT", "0") != "0":
    print(f"{node} recovered", flush=True)
    sys.exit(0)
print(f"{node} ready", flush=True)
while not os.path.exists(go) or not open(go).read().endswith("\\n"):
    time.sleep(0.02)
t0 = float(open(go).read())
for i in range(int(sys.argv[3])):
    time.sleep(max(0.0, t0 + offset + 0.2 * i - time.time()))
    print(f"{node} tick {i}", flush=True)
    if node == NODES[0] and i % 2:
        print(f"[rank1]: {node} warn {i}", file=sys.stderr, flush=True)
print(f"{node} done", flush=True)
sys.exit(3 if node == NODES[0] else 0)
"""


def two_partitions() -> tuple[str, str]:
    """Two node names whose records land on different partitions of the logs topic."""
    from aiokafka.partitioner import DefaultPartitioner

    part = DefaultPartitioner()
    parts = list(range(DEFAULT_PARTITIONS))
    names = [f"node{i}" for i in range(64)]
    first = names[0]
    p0 = part(log_key("JOB", first), parts, parts)
    other = next(n for n in names if part(log_key("JOB", n), parts, parts) != p0)
    return first, other


def fw(bootstrap: str, prefix: str, *args: str, env: dict[str, str] | None = None
       ) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "faultwatch", *args, "--bootstrap", bootstrap,
                           "--topic-prefix", prefix], capture_output=True, text=True,
                          timeout=120, env={**os.environ, **(env or {})})


def publish(bootstrap: str, topic: str, records: list[tuple[bytes, bytes]]) -> None:
    asyncio.run(produce_records(bootstrap, topic, records))


def decision(job: str, action: str, kind: str, attempt: int = 0, nodes: tuple[str, ...] = (),
             ts: float | None = None, run_id: str = RUN) -> Decision:
    return Decision(id=f"{job}-{attempt}-{action}-{kind}", job=job, attempt=attempt,
                    action=action, kind=kind, ts=time.time() if ts is None else ts,
                    nodes=nodes, rule="test-rule", message=f"{action} because {kind}",
                    run_id=run_id)


def json_rows(text: str) -> list[dict[str, Any]]:
    return [json.loads(x) for x in text.splitlines() if x.strip()]


@pytest.fixture(scope="module")
def shipped(kafka_bootstrap: str, tmp_path_factory: pytest.TempPathFactory
            ) -> dict[str, Any]:
    """One job shipped by two real agents (n1 restarted once by a decision), with a
    `logs -f --json` started before them; returns what the tests read."""
    tmp = tmp_path_factory.mktemp("readers")
    prefix = f"t{uuid.uuid4().hex[:8]}."
    job = f"view-{uuid.uuid4().hex[:6]}"
    n1, n2 = two_partitions()
    topics = Topics(prefix)
    asyncio.run(ensure_topics(kafka_bootstrap, topics))
    follow_out = tmp / "follow.jsonl"
    follow = subprocess.Popen(  # started before the agents: everything arrives live
        [sys.executable, "-m", "faultwatch", "logs", job, "-f", "--json", "--bootstrap",
         kafka_bootstrap, "--topic-prefix", prefix], stdout=follow_out.open("w"),
        stderr=(tmp / "follow.err").open("w"))
    child = CHILD.replace("NODES[0]", repr(n1))
    go = tmp / "go"
    agents = {}
    for node, offset, extra in ((n1, 0.0, ("--follow-decisions", "--decision-wait-s", "60")),
                                (n2, 0.1, ("--no-follow-decisions",))):
        argv = [sys.executable, "-m", "faultwatch", "agent", "--bootstrap", kafka_bootstrap,
                "--job", job, "--node", node, "--topic-prefix", prefix, "--spool-dir",
                str(tmp / node), "--heartbeat-s", "1", "--run-id", RUN, *extra, "--",
                sys.executable, "-c", child, node, str(offset), str(TICKS), str(go)]
        agents[node] = subprocess.Popen(argv, stdout=(tmp / f"{node}.out").open("w"),
                                        stderr=(tmp / f"{node}.err").open("w"))
    try:
        for node in agents:
            wait_until(lambda n=node: f"{n} ready" in (tmp / f"{n}.out").read_text(), 120,
                       f"{node}'s child to start")
        go.write_text(f"{time.time() + 0.5}\n")
        wait_until(lambda: f"{n1} done" in (tmp / f"{n1}.out").read_text(), 120,
                   f"{n1}'s attempt 0 to end")
        time.sleep(0.5)  # the restart decision comes after attempt 0's exit, as a processor's
        publish(kafka_bootstrap, topics.decisions, [(wire.job_key(job), wire.encode_decision(
            decision(job, "restart", "error", nodes=(n1,))))])
        for node, p in agents.items():
            p.wait(timeout=120)
            assert p.returncode == 0, (node, (tmp / f"{node}.err").read_text()[-3000:])
        wait_until(lambda: f"{n1} recovered" in follow_out.read_text(), 60,
                   "the relaunched attempt's line in `logs -f`")
        wait_until(lambda: sum(r["type"] == "exit" for r in json_rows(follow_out.read_text()))
                   == 3, 60, "three exits in `logs -f`")
    finally:
        for p in agents.values():
            if p.poll() is None:
                p.kill()
        follow.terminate()
        follow.wait(timeout=30)
    return {"prefix": prefix, "job": job, "n1": n1, "n2": n2,
            "follow": json_rows(follow_out.read_text())}


def test_follow_shows_lines_separators_and_the_decision_as_they_come(
        shipped: dict[str, Any]) -> None:
    rows = shipped["follow"]
    assert all(tuple(r) == ROW_FIELDS for r in rows)
    texts = [r["text"] for r in rows if r["type"] == "line"]
    for node in (shipped["n1"], shipped["n2"]):
        assert [t for t in texts if t.startswith(f"{node} tick")] == \
            [f"{node} tick {i}" for i in range(TICKS)]
    attempts = [r for r in rows if r["type"] == "attempt"]
    assert [a["attempt"] for a in attempts] == [0, 1]
    assert attempts[1]["decision"]["action"] == "restart"


def test_history_is_in_time_order_across_partitions(kafka_bootstrap: str,
                                                    shipped: dict[str, Any]) -> None:
    res = fw(kafka_bootstrap, shipped["prefix"], "logs", shipped["job"], "--json")
    assert res.returncode == 0, res.stderr[-2000:]
    rows = json_rows(res.stdout)
    assert all(tuple(r) == ROW_FIELDS for r in rows)
    ts = [r["ts"] for r in rows]
    assert ts == sorted(ts), "rows out of time order"
    nodes = [r["node"] for r in rows if r["type"] == "line" and "tick" in r["text"]]
    switches = sum(a != b for a, b in zip(nodes, nodes[1:], strict=False))
    assert switches >= TICKS, nodes  # the two nodes' ticks interleave, not node after node
    warn = [r for r in rows if r["type"] == "line" and "warn" in r["text"]]
    assert warn and all(r["rank"] == 1 and r["stream"] == "stderr" for r in warn)
    assert not any(r["text"].startswith("[rank1]") for r in warn)  # the prefix is the rank
    kinds = [r["type"] for r in rows]
    assert kinds.index("decision") < max(i for i, r in enumerate(rows)
                                          if r["type"] == "attempt")  # decision, then attempt 1


def test_text_output_in_a_pipe_is_plain_with_separators(kafka_bootstrap: str,
                                                        shipped: dict[str, Any]) -> None:
    job, n1, n2 = shipped["job"], shipped["n1"], shipped["n2"]
    res = fw(kafka_bootstrap, shipped["prefix"], "logs", job)
    assert res.returncode == 0, res.stderr[-2000:]
    out = res.stdout
    assert "\x1b" not in out  # not a terminal: no colour codes
    assert re.search(rf"^\d\d:\d\d:\d\d\.\d{{3}} \[{n1}\] {n1} tick 0$", out, re.M), out
    assert re.search(rf"\[{n1}/rank1 !\] {n1} warn 1$", out, re.M), out
    assert f"── attempt 0 of {job} (run {RUN}) starts" in out
    assert re.search(rf"── attempt 1 of {job} \(run {RUN}\) starts \({n1} first\), after "
                     rf"restart decision {job}-0-restart-error \(error, rule test-rule\): "
                     "restart because error ──", out), out
    assert f"── {n1} attempt 0: exited with code 3" in out
    assert f"── {n2} attempt 0: exited with code 0" in out
    assert f"{n1} recovered" in out


def test_filters_tail_and_since(kafka_bootstrap: str, shipped: dict[str, Any]) -> None:
    prefix, job, n2 = shipped["prefix"], shipped["job"], shipped["n2"]
    res = fw(kafka_bootstrap, prefix, "logs", job, "--node", n2, "--grep", r"tick (3|7)$",
             "--json")
    assert res.returncode == 0, res.stderr[-2000:]
    rows = json_rows(res.stdout)
    assert [r["text"] for r in rows if r["type"] == "line"] == [f"{n2} tick 3", f"{n2} tick 7"]
    assert {r["type"] for r in rows} <= {"line", "attempt", "decision", "exit"}
    assert all(r["node"] == n2 for r in rows if r["type"] == "exit")

    res = fw(kafka_bootstrap, prefix, "logs", job, "--tail", "3", "--rank", "1")
    assert res.returncode == 0, res.stderr[-2000:]
    assert len(res.stdout.splitlines()) == 3, res.stdout
    assert res.stdout.splitlines()[-1].endswith(f"── {shipped['n1']} attempt 1: exited with "
                                                "code 0")

    res = fw(kafka_bootstrap, prefix, "logs", job, "--since", str(time.time() + 3600))
    assert (res.returncode, res.stdout) == (0, "")  # nothing since then: not an error


def test_unknown_job_and_bad_filters(kafka_bootstrap: str, shipped: dict[str, Any]) -> None:
    res = fw(kafka_bootstrap, shipped["prefix"], "logs", "no-such-job")
    assert res.returncode == EXIT_NOT_FOUND, res.stderr
    assert "no record of job 'no-such-job'" in res.stderr and shipped["job"] in res.stderr
    res = fw(kafka_bootstrap, shipped["prefix"], "logs", shipped["job"], "--grep", "(")
    assert res.returncode == EXIT_USAGE and "--grep" in res.stderr, res.stderr


def test_decisions_filters(kafka_bootstrap: str, topic_prefix: str) -> None:
    topic = Topics(topic_prefix).decisions
    job = "dec-filters"
    decs = [decision(job, "restart", "error"), decision(job, "fail", "hang", attempt=1),
            decision(job, "notify", "slow", attempt=1, ts=time.time() - 7200),
            decision("other", "restart", "hang")]
    publish(kafka_bootstrap, topic, [(wire.job_key(d.job), wire.encode_decision(d))
                                     for d in decs])

    def ids(*args: str) -> list[str]:
        res = fw(kafka_bootstrap, topic_prefix, "decisions", "--json", *args)
        assert res.returncode == 0, res.stderr[-2000:]
        return [r["id"] for r in json_rows(res.stdout)]

    assert ids("--job", job) == [d.id for d in decs[:3]]  # positive control
    assert ids("--job", job, "--action", "restart", "--action", "notify") == \
        [decs[0].id, decs[2].id]
    assert ids("--kind", "hang") == [decs[1].id, decs[3].id]
    assert ids("--job", job, "--since", "1h") == [decs[0].id, decs[1].id]

    # text as a person reads it: when each was made, and its age (issue 36 item 6)
    res = fw(kafka_bootstrap, topic_prefix, "decisions", "--job", job)
    heads = [x for x in res.stdout.splitlines() if x.startswith("[faultwatch] decision")]
    assert len(heads) == 3 and all(re.search(r" time=\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ "
                                             r"age=\d", h) for h in heads), res.stdout
    assert heads[2].endswith(("age=120m", "age=121m")), heads[2]  # 2 h ago, as kubectl
    # a job never seen is exit 7 naming the close ones, like `logs` and `status` (item 7)
    res = fw(kafka_bootstrap, topic_prefix, "decisions", "--job", "dec-filtres")
    assert res.returncode == EXIT_NOT_FOUND and res.stdout == "", res
    assert "no decision of job 'dec-filtres'" in res.stderr
    assert "did you mean 'dec-filters'" in res.stderr, res.stderr
    # a job the processors report that has no decision yet is no mistake: nothing, exit 0
    snap = snapshot("quiet-job", "running", time.time())
    publish(kafka_bootstrap, Topics(topic_prefix).status,
            [(wire.job_key("quiet-job"), wire.encode_status(snap))])
    res = fw(kafka_bootstrap, topic_prefix, "decisions", "--job", "quiet-job")
    assert (res.returncode, res.stdout) == (0, ""), res.stderr


def snapshot(job: str, phase: str, ts: float) -> dict[str, Any]:
    from faultwatch.core.events import RunStart
    from faultwatch.core.job import apply
    from faultwatch.core.policy import Policy
    from faultwatch.core.state import JobState
    from faultwatch.core.status import snapshot as make

    policy = Policy()
    st = JobState(job=job)
    for node, rank in (("n1", 0), ("n2", 1)):
        st, _ = apply(st, RunStart(job, 0, node, ts, run_id="slurm-12345678", world_size=2,
                                   nnodes=2, rank=rank), ts, policy)
    return {**make(st, ts, policy), "phase": phase}


def test_status_fits_80_columns_ages_out_and_names_unknown_jobs(
        kafka_bootstrap: str, topic_prefix: str) -> None:
    topics = Topics(topic_prefix)
    asyncio.run(ensure_topics(kafka_bootstrap, topics))
    now = time.time()
    long = "train-llama-70b-pretraining-stage2-" + "x" * 40 + "-final"
    snaps = [snapshot(long, "running", now), snapshot("done-old", "done", now - 7200),
             snapshot("done-new", "done", now - 60)]
    publish(kafka_bootstrap, topics.status, [(wire.job_key(s["job"]), wire.encode_status(s))
                                             for s in snaps])
    env = {"COLUMNS": "80"}
    res = fw(kafka_bootstrap, topic_prefix, "status", env=env)
    assert res.returncode == 0, res.stderr[-2000:]
    lines = res.stdout.splitlines()
    assert max(len(x) for x in lines) <= 80, res.stdout
    assert "(1 finished job hidden)" in res.stdout and "done-old" not in res.stdout
    row = next(x for x in lines if x.startswith("train-"))
    assert "…" in row and "-final" in row and "running" in row and "2/2" in row
    assert "done-new" in res.stdout
    res = fw(kafka_bootstrap, topic_prefix, "status", "--finished-for-s", "86400", "--json")
    assert "done-old" in {r["job"] for r in json_rows(res.stdout)}  # a longer window shows it
    res = fw(kafka_bootstrap, topic_prefix, "status", "never-seen")
    assert res.returncode == EXIT_NOT_FOUND, (res.returncode, res.stderr)
    assert "no processor reports job 'never-seen'" in res.stderr and res.stdout == ""
    res = fw(kafka_bootstrap, topic_prefix, "status", "done-old", "--json")
    assert res.returncode == 0 and json_rows(res.stdout)[0]["job"] == "done-old"  # named


def test_status_in_a_pipe_keeps_every_cell_whole_and_prints_a_block_per_refresh(
        kafka_bootstrap: str, topic_prefix: str) -> None:
    """`status --wide | cat` and `status -w > file` (issue 36 item 6): one row per line,
    nothing wrapped or cut, no padding; `-w` prints a block per refresh."""
    topics = Topics(topic_prefix)
    asyncio.run(ensure_topics(kafka_bootstrap, topics))
    long = "train-llama-70b-pretraining-stage2-" + "x" * 40 + "-final"
    snaps = [snapshot(long, "running", time.time()), snapshot("j2", "running", time.time())]
    publish(kafka_bootstrap, topics.status, [(wire.job_key(s["job"]), wire.encode_status(s))
                                             for s in snaps])
    env = {k: v for k, v in os.environ.items() if k != "COLUMNS"}
    for wide in ([], ["--wide"]):
        res = subprocess.run(  # a real shell pipe, as a person types it
            f"{sys.executable} -m faultwatch status {' '.join(wide)} --bootstrap "
            f"{kafka_bootstrap} --topic-prefix {topic_prefix} | grep -- -final",
            shell=True, capture_output=True, text=True, timeout=120, env=env)
        assert res.returncode == 0, res.stderr[-2000:]
        rows = res.stdout.splitlines()
        assert len(rows) == 1 and rows[0].startswith(long + "  "), res.stdout
        assert "running" in rows[0] and rows[0] == rows[0].rstrip()
        if wide:
            assert "slurm-12345678" in rows[0] and "\x1b" not in rows[0]
    res = fw(kafka_bootstrap, topic_prefix, "status", "--wide", env={"COLUMNS": ""})
    assert all(x == x.rstrip() for x in res.stdout.splitlines()), res.stdout
    out = subprocess.Popen([sys.executable, "-m", "faultwatch", "status", "-w",
                            "--interval-s", "0.5", "--bootstrap", kafka_bootstrap,
                            "--topic-prefix", topic_prefix], stdout=subprocess.PIPE,
                           stderr=subprocess.PIPE, text=True, env=env)
    seen: list[str] = []
    reader = threading.Thread(target=lambda: seen.extend(out.stdout or ()), daemon=True)
    reader.start()
    try:
        wait_until(lambda: sum(x.startswith("faultwatch status") for x in seen), 120,
                   "two blocks of `status -w` in a pipe", until=lambda n: n >= 2,
                   detail=lambda: "".join(seen)[-2000:])
        first = "".join(seen).split("\n\n")[0].splitlines()
        assert [x for x in first if x.startswith(long)] and len(first) == 4, seen
    finally:
        out.terminate()
        out.wait(30)
