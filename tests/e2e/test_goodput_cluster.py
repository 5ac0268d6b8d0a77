"""Goodput in cluster mode (agents -> Kafka -> a real processor -> <prefix>incidents, read back
with `faultwatch report`): a torchrun DDP job over two agents loses a node (its agent
SIGKILLed) against the job's own true timeline; and one job run in embedded and in cluster
mode gives the same incidents and the same goodput."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from faultwatch import wire
from tests.support.cluster import (
    agent_cmd,
    decisions,
    processor,
    wait_decisions,
    wait_processor_ready,
)
from tests.support.goodput_truth import (
    ExitWatch,
    compare,
    computed_parts,
    read_truth,
    true_parts,
)
from tests.support.kafka import consume
from tests.support.processes import faultwatch_exe, job_env
from tests.support.waiting import wait_until

pytestmark = [pytest.mark.slow, pytest.mark.kafka]

JOBS = Path(__file__).resolve().parent / "jobs"
POLICY = """version: 1
policy:
  hang_window_s: 20
  init_window_s: 180
  node_lost_s: 6
  settle_s: 1
  max_restarts: 5
  restart_backoff_s: 0.1
  diagnose: false
  hang_needs_evidence: false
"""


@pytest.fixture(scope="module")
def cluster(kafka_bootstrap: str, tmp_path_factory: pytest.TempPathFactory
            ) -> Iterator[tuple[str, str, Path]]:
    d = tmp_path_factory.mktemp("gp-cluster")
    pol = d / "policy.yaml"
    pol.write_text(POLICY)
    prefix = f"gp{os.getpid()}{int(time.time()) % 100000}."
    log = d / "processor.log"
    with processor(kafka_bootstrap, prefix, log, "--rules", str(pol)) as proc:
        wait_processor_ready(kafka_bootstrap, prefix, proc, log)
        yield kafka_bootstrap, prefix, pol
        assert proc.poll() is None, f"processor died:\n{log.read_text()[-4000:]}"


def report(bootstrap: str, prefix: str, job: str) -> dict[str, Any] | None:
    out = subprocess.run([faultwatch_exe(), "report", job, "--bootstrap", bootstrap,
                          "--topic-prefix", prefix, "--json"], capture_output=True, text=True,
                         timeout=60, env=job_env())
    return json.loads(out.stdout) if out.returncode == 0 else None


def final_report(bootstrap: str, prefix: str, job: str, attempts: int) -> dict[str, Any]:
    """The job's ledger once the processor published its last attempt's end."""
    def done(r: dict[str, Any] | None) -> bool:
        return r is not None and len(r["attempts"]) == attempts \
            and r["attempts"][-1]["end_ts"] is not None
    rep = wait_until(lambda: report(bootstrap, prefix, job), 90,
                     f"the final ledger of {job}", interval_s=1.0, until=done)
    assert rep is not None
    return rep


SAVED = "successfully saved checkpoint from iteration"


def heartbeat_after_checkpoint(recs: list[dict[str, Any]], job: str, saver: str, lost: str
                               ) -> float | None:
    """The ts of a heartbeat of `lost` shipped after the first checkpoint's end line of
    `saver` (both as stamped by their agents, attempt 0), or None while there is none.

    A node-lost incident's first sign is the lost node's last heartbeat, and a checkpoint
    counts for it only once saved before that (core/incidents.py): an agent killed less
    than a heartbeat after the save may have sent its last heartbeat before it."""
    saved = [ln.ts for r in recs if r.get("t") == "lines" and r.get("job") == job
             and r.get("node") == saver and r.get("attempt") == 0
             for ln in wire.lines_of(r) if SAVED in ln.text]
    if not saved:
        return None
    return next((float(r["ts"]) for r in recs if r.get("t") == "hb" and r.get("job") == job
                 and r.get("node") == lost and r.get("attempt") == 0
                 and float(r["ts"]) > min(saved)), None)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_a_lost_node_against_the_truth(cluster: tuple[str, str, Path], tmp_path: Path) -> None:
    """Two agents (node-0, node-1) each run one node of a torchrun DDP job. node-1's agent is
    SIGKILLed: its heartbeats stop while its rank trains on, unseen. node-lost restarts the
    job; the "scheduler" (this test) brings node-1 back for attempt 1."""
    bootstrap, prefix, _ = cluster
    job = f"gp-lost-{uuid.uuid4().hex[:8]}"  # a rerun must not read this try's decisions
    gp = tmp_path / "gp"
    gp.mkdir()
    port = free_port()
    env = {**job_env(), "GP_DIR": str(gp), "GP_PLAN": "none", "GP_LAST": "400,20",
           "GP_CKPTS": "5", "GP_EVALS": "", "GP_STEP_S": "0.1"}

    def node_cmd(rank: int) -> list[str]:
        return [sys.executable, "-m", "torch.distributed.run", "--nnodes=2",
                f"--node-rank={rank}", "--nproc-per-node=1", "--master-addr=127.0.0.1",
                f"--master-port={port}", str(JOBS / "goodput_ddp.py")]

    def agent(rank: int, attempt: int) -> subprocess.Popen[bytes]:
        cmd = agent_cmd(bootstrap, prefix, job, f"node-{rank}", node_cmd(rank),
                        "--follow-decisions", "--spool-dir", str(tmp_path / f"spool{rank}"))
        with open(tmp_path / f"agent{rank}-{attempt}.log", "wb") as log:
            return subprocess.Popen(cmd, env={**env, "FAULTWATCH_ATTEMPT": str(attempt)},
                                    stdout=log, stderr=subprocess.STDOUT,
                                    start_new_session=True)

    truth = gp / "truth.jsonl"
    watch = ExitWatch(truth)
    procs = [agent(0, 0)]
    try:
        procs.append(agent(1, 0))
        wait_until(lambda: truth.exists() and truth.read_text().count('"ev": "step"') >= 12,
                   180, "12 steps of attempt 0")
        # the checkpoint at step 5 comes before node-1's last heartbeat: it counts
        recs = consume(bootstrap, f"{prefix}logs", lambda got: heartbeat_after_checkpoint(
            got, job, "node-0", "node-1") is not None, timeout=60)
        assert heartbeat_after_checkpoint(recs, job, "node-0", "node-1") is not None, \
            "no heartbeat of node-1 after node-0's checkpoint on the logs topic"
        killed = time.time()
        os.kill(procs[1].pid, signal.SIGKILL)  # the agent only: its rank trains on, unseen
        decs = wait_decisions(bootstrap, prefix, job, timeout_s=60)
        assert [(d["action"], d["reason"]["kind"]) for d in decs] == \
            [("restart", "node-lost")], decs
        for r in map(json.loads, truth.read_text().splitlines()):  # node-1 "reboots": its
            if r["ev"] == "launch" and r["attempt"] == 0 and r["rank"] == 1:  # torchrun and
                for pid in (r["torchrun_pid"], r["pid"]):  # rank (own sessions) are gone
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(pid, signal.SIGKILL)
        procs.append(agent(1, 1))
        for p in (procs[0], procs[2]):
            assert p.wait(240) == 0, (tmp_path / "agent0-0.log").read_text()[-3000:]
    finally:
        for p in procs:
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGKILL)
    exits = watch.stop()
    rep = final_report(bootstrap, prefix, job, 2)
    (inc,) = rep["incidents"]
    assert (inc["cause"], inc["nodes"], inc["ckpt_step"]) == ("node-lost", ["node-1"], 5), inc
    assert inc["first_sign_ts"] <= killed + 0.1 and inc["acted_ts"] is not None
    attempts = read_truth(truth)
    attempts[0].fault, attempts[0].fault_ts = "node-lost", killed
    pid_attempt = {r["torchrun_pid"]: r["attempt"] for r in map(json.loads, truth.read_text(
        ).splitlines()) if r["ev"] == "launch"}
    end = max(t for pid, t in exits.items() if pid_attempt.get(pid) == 1)
    t = true_parts(attempts, {0: decisions(bootstrap, prefix, job)[0]["ts"]}, end)
    got = computed_parts(rep["account"])
    print(f"\n{rep['goodput']}\n" + "\n".join(
        f"  {k:<13} computed {got.get(k, 0.0):7.2f}  true {v:7.2f}"
        for k, v in t["parts"].items()))
    assert compare(got, t["parts"]) == []
    assert inc["lost_steps"] == t["lost_steps"][0]


def run_plain_embedded(tmp: Path, pol: Path, env: dict[str, str]) -> dict[str, Any]:
    inc = tmp / "incidents.jsonl"
    proc = subprocess.run([faultwatch_exe(), "run", "--job", "same", "--rules", str(pol),
                           "--incidents-out", str(inc), "--", sys.executable,
                           str(JOBS / "goodput_plain.py")], env=env, capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = subprocess.run([faultwatch_exe(), "report", "same", "--from", str(inc), "--json"],
                         capture_output=True, text=True, timeout=60, env=job_env())
    assert out.returncode == 0, out.stderr
    return dict(json.loads(out.stdout))


def test_embedded_and_cluster_give_the_same_incidents_and_goodput(
        cluster: tuple[str, str, Path], tmp_path: Path) -> None:
    bootstrap, prefix, pol = cluster
    reps = {}
    for mode in ("embedded", "cluster"):
        gp = tmp_path / mode
        gp.mkdir()
        env = {**job_env(), "GP_DIR": str(gp), "GP_PLAN": "crash@14,none", "GP_STEPS": "20",
               "GP_CKPTS": "10"}
        if mode == "embedded":
            reps[mode] = run_plain_embedded(gp, pol, env)
            continue
        job = f"gp-same-{uuid.uuid4().hex[:8]}"
        p = subprocess.run(agent_cmd(bootstrap, prefix, job, "node-0",
                                     [sys.executable, str(JOBS / "goodput_plain.py")],
                                     "--follow-decisions", "--spool-dir", str(gp / "spool")),
                           env=env, capture_output=True, text=True, timeout=180)
        assert p.returncode == 0, p.stderr[-3000:]
        reps[mode] = final_report(bootstrap, prefix, job, 2)
    emb, clu = reps["embedded"], reps["cluster"]

    def shape(r: dict[str, Any]) -> list[tuple[Any, ...]]:
        return [(i["attempt"], i["cause"], i["rule"], i["ckpt_step"], i["lost_steps"],
                 i["acted_ts"] is not None, i["recovered_ts"] is not None)
                for i in r["incidents"]]

    assert shape(emb) == shape(clu) == [(0, "error", "connection-timed-out", 10, 3, True,
                                         True)]
    assert len(emb["attempts"]) == len(clu["attempts"]) == 2
    a, b = computed_parts(emb["account"]), computed_parts(clu["account"])
    print(f"\nembedded: {emb['goodput']}\ncluster:  {clu['goodput']}")
    assert compare(a, b) == [], (a, b)
    assert abs(emb["account"]["wall_s"] - clu["account"]["wall_s"]) <= 2.0
