"""The stop end of the timeout chain under real Slurm (KillWait=5, tests/support/slurm.py):
an agent whose stop (term grace + exit flush) outlasts KillWait says so when it starts, and a
real `scancel` then SIGKILLs it before its exit record is flushed; an agent whose stop fits
says nothing, and its exit record arrives (the positive control, in the same run).

The command ignores SIGTERM (as a rank finishing a collective or a checkpoint does), so the
agent's whole --term-grace-s is spent before it can record the exit."""

from __future__ import annotations

import shutil
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.support.agents import has_exit
from tests.support.kafka import consume, read_topic
from tests.support.processes import job_env
from tests.support.slurm import SlurmCluster, missing
from tests.support.waiting import wait_until

pytestmark = [pytest.mark.slow, pytest.mark.kafka]

CHILD = ("import signal, time\nsignal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
         "print('up', flush=True)\ntime.sleep(300)\n")
BATCH = '''#!{python}
import os
argv = [{python!r}, "-m", "faultwatch", "agent", "--job", {job!r}, "--node",
        os.environ["SLURMD_NODENAME"], "--heartbeat-s", "1", *{flags!r}, "--",
        {python!r}, "-c", {child!r}]
os.execve(argv[0], argv, dict(os.environ))
'''


@pytest.fixture(scope="module")
def slurm() -> Iterator[SlurmCluster]:
    why = missing()
    if why:
        pytest.fail(why)  # a missing Slurm is a broken test install, not a reason to skip
    cluster = SlurmCluster()
    try:
        cluster.start()
        yield cluster
    finally:
        cluster.stop()


def submit(slurm: SlurmCluster, tmp_path: Path, name: str, prefix: str, bootstrap: str,
           flags: list[str]) -> tuple[str, Path]:
    batch = tmp_path / f"{name}.py"
    batch.write_text(BATCH.format(python=sys.executable, job=f"{name}-{uuid.uuid4().hex[:6]}",
                                  flags=flags, child=CHILD))
    batch.chmod(0o755)
    env = slurm.env(job_env())
    env.update(FAULTWATCH_BOOTSTRAP=bootstrap, FAULTWATCH_TOPIC_PREFIX=prefix,
               FAULTWATCH_SPOOL_DIR=str(tmp_path / f"spool-{name}"))
    out = tmp_path / f"{name}.out"
    r = subprocess.run([shutil.which("sbatch") or "/usr/bin/sbatch", "--parsable",
                        f"--job-name={name}", f"--output={out}", str(batch)], env=env,
                       capture_output=True, text=True, timeout=30)
    assert r.returncode == 0, r.stderr
    return r.stdout.strip().split(";")[0], out


def records(bootstrap: str, prefix: str) -> list[dict[str, Any]]:
    from faultwatch import wire

    return [wire.decode(m.value) for m in read_topic(bootstrap, f"{prefix}logs")]


def test_an_agent_stop_longer_than_killwait_loses_its_exit_record(
        slurm: SlurmCluster, kafka_bootstrap: str, tmp_path: Path) -> None:
    prefixes = {n: f"kw{n}{uuid.uuid4().hex[:6]}." for n in ("long", "short")}
    jobs = {  # the agent's defaults (10 s + 10 s) against KillWait 5 s; 1 s + 2 s fits
        "long": submit(slurm, tmp_path, "long", prefixes["long"], kafka_bootstrap, []),
        "short": submit(slurm, tmp_path, "short", prefixes["short"], kafka_bootstrap,
                        ["--term-grace-s", "1", "--exit-flush-timeout-s", "2"]),
    }

    def diag() -> str:
        return "".join(f"--- {p.name}\n{p.read_text()[-2000:]}\n"
                       for p in tmp_path.glob("*.out") if p.exists()) + slurm.logs_tail(10)

    # both commands are up and their first line is on Kafka
    for n, prefix in prefixes.items():
        recs = consume(kafka_bootstrap, f"{prefix}logs",
                       lambda rs: any(r.get("t") == "lines" for r in rs), timeout=90)
        assert any(r.get("t") == "lines" for r in recs) and not has_exit(recs), (n, diag())
    # the check at the agent's start: the long stop is a broken link, the short one nests
    long_out = jobs["long"][1].read_text()
    assert "faultwatch agent: timeout chain: 1 broken link" in long_out, diag()
    assert "agent-vs-scheduler" in long_out and "KillWait 5 s" in long_out
    assert "scontrol show config KillWait" in long_out  # read from the real Slurm
    assert "timeout chain" not in jobs["short"][1].read_text(), diag()

    for jid, _ in jobs.values():
        slurm.run("scancel", jid)

    # the positive control: the short stop records the exit and flushes it in time
    recs = consume(kafka_bootstrap, f"{prefixes['short']}logs", has_exit, timeout=60)
    assert has_exit(recs), diag()
    # the long one is SIGKILLed by slurmd at KillWait, still inside its term grace
    jid = jobs["long"][0]
    wait_until(lambda: slurm.job_info(jid).get("JobState") == "CANCELLED"
               and _gone(slurm, jid), 60,
               f"job {jid} cancelled and its processes gone", interval_s=0.5, detail=diag)
    assert not has_exit(records(kafka_bootstrap, prefixes["long"])), diag()


def _gone(slurm: SlurmCluster, jid: str) -> bool:
    """No step of the job left on its node (squeue shows none)."""
    r = slurm.run("squeue", "-h", "-j", jid, check=False)
    return r.returncode != 0 or not r.stdout.strip()
