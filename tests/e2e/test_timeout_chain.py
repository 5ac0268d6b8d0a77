"""The timeout chain on real launches (issue 40, docs/timeouts.md): a 2-node torchrun (gloo,
CPU) under two agents and a processor, node n2 started SKEW_S after n1's torchrun began its
rendezvous.

1. The first link: with a 6 s init window and hang ceiling, n1 waits legitimately for n2 in
   torchrun's rendezvous (join_timeout 60 s) and is not decided hung (the processor holds a
   silent start to the launcher's own deadline); the same run's silence after its ranks
   printed is a hang within the window (the positive control: detection was live).
2. The processor recorded the run's start skew: `faultwatch check --bootstrap` predicts that a
   rendezvous of 6 s cannot take it (exit 9 with --strict), and says the 60 s one nests (the
   clean chain, exit 0).
3. The 6 s launch then fails as predicted: a rendezvous timeout before any step.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from faultwatch.errors import EXIT_CHAIN
from tests.support.cluster import agent_cmd, processor, wait_decisions, wait_processor_ready
from tests.support.processes import faultwatch_exe, job_env, stop_group
from tests.support.waiting import wait_until

pytestmark = [pytest.mark.slow, pytest.mark.kafka]

JOB = Path(__file__).parent / "jobs" / "two_nodes.py"
SKEW_S = 8.0  # the injected start skew between the two nodes


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def two_node_torchrun(port: int, join_timeout_s: int, rdzv_id: str) -> list[str]:
    return [sys.executable, "-m", "torch.distributed.run", "--nnodes", "2",
            "--nproc-per-node", "1", "--rdzv-backend", "c10d", "--rdzv-endpoint",
            f"127.0.0.1:{port}", "--rdzv-id", rdzv_id, "--rdzv-conf",
            f"join_timeout={join_timeout_s}", str(JOB)]


def listening(port: int) -> bool:
    import socket

    with socket.socket() as s:
        s.settimeout(0.5)
        return s.connect_ex(("127.0.0.1", port)) == 0


def late(argv: list[str], log: Path, port: int, first: subprocess.Popen[bytes],
         **env: str) -> subprocess.Popen[bytes]:
    """`argv` started SKEW_S after the first node's torchrun is waiting in the rendezvous
    (its c10d store listens on `port`): the injected skew is a deliberate delay, counted
    from that event, so the first node's start-up time (seconds, and uneven on a loaded
    machine) is not part of it. In its own process group, output to `log`."""
    def waiting() -> bool:
        assert first.poll() is None, f"the first node exited {first.returncode}"
        return listening(port)

    wait_until(waiting, 120, f"the first node's rendezvous store on port {port}",
               interval_s=0.2)
    time.sleep(SKEW_S)
    with open(log, "wb") as out:
        return subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT,
                                env=job_env(**env), start_new_session=True)


SKEW_RULES = "version: 1\nrules: []\npolicy:\n  skew_warn_s: 4\n"
WINDOWS = ("--init-window-s", "6", "--hang-ceiling-s", "6", "--hang-floor-s", "2",
           "--max-restarts", "0", "--settle-s", "1")


@pytest.fixture(scope="module")
def cluster(kafka_bootstrap: str, tmp_path_factory: pytest.TempPathFactory
            ) -> Iterator[tuple[str, str]]:
    """A processor with short windows that records start skews from 4 s on."""
    d = tmp_path_factory.mktemp("chain")
    (d / "skew.yaml").write_text(SKEW_RULES)
    prefix = f"chain{uuid.uuid4().hex[:8]}."
    log = d / "processor.log"
    with processor(kafka_bootstrap, prefix, log, "--rules", str(d / "skew.yaml"),
                   *WINDOWS) as proc:
        wait_processor_ready(kafka_bootstrap, prefix, proc, log)
        yield kafka_bootstrap, prefix
        assert proc.poll() is None, f"processor died:\n{log.read_text()[-4000:]}"


class TwoNodes:
    """Two agents (n1 now, n2 SKEW_S later) of `job` around a 2-node torchrun."""

    def __init__(self, cluster: tuple[str, str], job: str, join_timeout_s: int,
                 tmp_path: Path, **env: str) -> None:
        bootstrap, prefix = cluster
        port = free_port()
        cmd = two_node_torchrun(port, join_timeout_s, job)
        self.logs = {n: tmp_path / f"{job}-{n}.log" for n in ("n1", "n2")}
        argv = {n: agent_cmd(bootstrap, prefix, job, n, cmd, "--spool-dir",
                             str(tmp_path / n), "--decision-wait-s", "6")
                for n in ("n1", "n2")}
        self.t0 = time.time()
        with open(self.logs["n1"], "wb") as out:
            self.n1 = subprocess.Popen(argv["n1"], stdout=out, stderr=subprocess.STDOUT,
                                       env=job_env(**env), start_new_session=True)
        try:
            self.n2 = late(argv["n2"], self.logs["n2"], port, self.n1, **env)
        except BaseException:
            stop_group(self.n1)
            raise

    def wait(self) -> tuple[int, int]:
        return self.n1.wait(timeout=120), self.n2.wait(timeout=120)

    def stop(self) -> None:
        stop_group(self.n1)
        stop_group(self.n2)

    def output(self, node: str) -> str:
        return self.logs[node].read_text(errors="replace")


def check(cluster: tuple[str, str], job: str, *join_timeouts_s: int
          ) -> list[tuple[int, dict[str, Any]]]:
    """`faultwatch check --bootstrap --job --json --strict` of the launch with each join
    timeout, run side by side."""
    bootstrap, prefix = cluster
    procs = [subprocess.Popen([faultwatch_exe(), "check", "--bootstrap", bootstrap,
                               "--topic-prefix", prefix, "--job", job, "--json", "--strict",
                               "--", *two_node_torchrun(1, t, job)],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                              env=job_env()) for t in join_timeouts_s]
    out = []
    for p in procs:
        stdout, stderr = p.communicate(timeout=120)
        assert p.returncode in (0, EXIT_CHAIN), stderr
        out.append((p.returncode, json.loads(stdout)))
    return out


def kinds(decs: list[dict[str, Any]]) -> list[str]:
    return sorted(d["reason"]["kind"] for d in decs)


def test_a_skewed_launch_is_held_recorded_predicted_and_fails_as_predicted(
        cluster: tuple[str, str], tmp_path: Path) -> None:
    job = f"skew-{uuid.uuid4().hex[:6]}"
    # 1. n1 waits for n2 (8 s late) in a 60 s rendezvous: no hang; the silence after the
    #    steps is one (the ranks sleep, alive and silent)
    run = TwoNodes(cluster, job, 60, tmp_path, FW_THEN="silent")
    try:
        decs = wait_decisions(*cluster, job, timeout_s=150, count=2)
    finally:
        run.stop()
    out = run.output("n1") + run.output("n2")
    assert kinds(decs) == ["hang", "skew"], (decs, out[-3000:])
    hang = next(d for d in decs if d["reason"]["kind"] == "hang")
    assert hang["evidence"]["silent_since"] >= run.t0 + SKEW_S, (hang, run.t0)
    assert "start_held_until" not in hang["evidence"]
    assert "step 2 rank" in out
    spread = next(d for d in decs if d["reason"]["kind"] == "skew")["evidence"]["spread_s"]
    assert SKEW_S <= spread <= SKEW_S + 60, spread  # + n1's own start-up

    # 2. the check reads that skew back: a rendezvous of 6 s cannot take it (exit 9 with
    #    --strict), one of 60 s nests (the clean chain: exit 0, no link broken)
    (code, short), (clean_code, clean) = check(cluster, job, 6, 60)
    links = {lk["id"]: lk for lk in short["links"]}
    assert code == EXIT_CHAIN and links["start-skew"]["status"] == "broken", links["start-skew"]
    assert "rendezvous deadline 6 s vs start skew" in links["start-skew"]["says"]
    assert "Socket Timeout" in links["start-skew"]["consequence"]
    assert [k for k, lk in links.items() if lk["status"] == "broken"] == ["start-skew"]
    assert clean_code == 0 and clean["nests"] is True, clean["links"]
    assert {lk["id"]: lk["status"] for lk in clean["links"]}["start-skew"] == "ok"

    # 3. and the 6 s launch fails as predicted: n1 times out in the rendezvous, no step
    run = TwoNodes(cluster, job, 6, tmp_path)
    try:
        rc1, rc2 = run.wait()
    finally:
        run.stop()
    out1, out2 = run.output("n1"), run.output("n2")
    assert rc1 != 0 and "RendezvousTimeoutError" in out1, out1[-3000:]
    assert rc2 != 0, out2[-3000:]
    assert "step 0" not in out1 + out2
