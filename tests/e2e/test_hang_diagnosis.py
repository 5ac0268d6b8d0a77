"""Naming the culprit of a real gloo hang: py-spy stacks and Flight Recorder dumps of real ranks."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from faultwatch.agents.dumps import capture, rank_pids, request_rank_dumps, stacks_of
from faultwatch.core.diagnosis import verdict
from faultwatch.dumps import flight_recorder, stacks
from tests.support.processes import job_env
from tests.support.waiting import wait_until

JOBS = Path(__file__).parent / "jobs"
JOB = JOBS / "collectives.py"
pytestmark = pytest.mark.slow


def _run_until_blocked(scenario: str, diag: Path) -> subprocess.Popen[str]:
    """Start the 2-rank job; return once both ranks printed `ready` (they block next)."""
    env = job_env(FW_SCENARIO=scenario, FAULTWATCH_DIAG_DIR=str(diag),
                  TORCH_FR_BUFFER_SIZE="2000")
    proc = subprocess.Popen([sys.executable, "-m", "torch.distributed.run", "--standalone",
                             "--nproc-per-node", "2", str(JOB)], env=env, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            start_new_session=True)
    ready: set[str] = set()
    out: list[str] = []
    done = threading.Event()

    def read() -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            out.append(line)
            # two ranks share torchrun's pipe: "ready 0ready 1" can come as one line
            ready.update(re.findall(r"ready (\d+)", line))
            if len(ready) == 2:
                done.set()
        done.set()

    threading.Thread(target=read, daemon=True).start()
    assert done.wait(120) and len(ready) == 2, "".join(out[-30:])
    return proc


def _kill_job(proc: subprocess.Popen[str] | subprocess.Popen[bytes]) -> None:
    """SIGKILL a torchrun job: its group and its ranks, which torchrun starts in sessions of
    their own (killing only the group left orphaned ranks blocked in all_reduce)."""
    ranks = rank_pids(proc.pid)
    os.killpg(proc.pid, signal.SIGKILL)
    for pid in ranks.values():
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    proc.wait(30)


def _blocked(pids: dict[int, int]) -> None:
    """Wait until the ranks are parked: some rank inside a collective and the picture the
    same in three captures in a row."""
    seen: list[str] = []

    def settled() -> bool:
        nonlocal seen
        st, _ = asyncio.run(stacks_of(pids))
        found = stacks.analyse(st)
        seen = (seen + [found.summary])[-3:]
        return found.in_collective and len(seen) == 3 and len(set(seen)) == 1

    wait_until(settled, 60, "the ranks to settle in a collective", interval_s=0.3,
               detail=lambda: f"last three pictures: {seen}")


@pytest.mark.parametrize("scenario, summary_fr, summary_stacks", [
    ("sleep", "rank 0 waits in all_reduce #6 (3\u00d74 float); rank 1 never entered it "
              "(rank 1 last entered #5)", "rank 0 in all_reduce; rank 1 is at collectives.py:"),
    ("extra", "rank 0 waits in all_reduce #7 (3\u00d74 float); rank 1 never entered it "
              "(rank 1 last entered #6)", "rank 0 in all_reduce; rank 1 is at collectives.py:"),
    ("mismatch", "collective #6 differs across ranks (rank 0: all_reduce #6 (3\u00d74 float); "
                 "rank 1: broadcast #6 (3\u00d74 float))", "ranks 0, 1 in all_reduce/broadcast"),
])
def test_culprit_named_from_real_ranks(tmp_path: Path, scenario: str, summary_fr: str,
                                       summary_stacks: str) -> None:
    proc = _run_until_blocked(scenario, tmp_path)
    try:
        pids = rank_pids(proc.pid)
        assert set(pids) == {0, 1}
        _blocked(pids)
        st, errors = asyncio.run(stacks_of(pids))
        assert not errors, errors
        found = stacks.analyse(st)
        assert found.summary.startswith(summary_stacks), found.summary
        dumps = asyncio.run(request_rank_dumps(tmp_path, {0, 1}, 30))
        assert set(dumps) == {0, 1}
        fr = {r: d["flight_recorder"] for r, d in dumps.items()}
        assert all(fr.values()), {r: d["fr_error"] for r, d in dumps.items()}
        a = flight_recorder.analyse(fr)
        assert a.summary == summary_fr
        assert 1 in a.culprits
        # the ranks' own stacks (no py-spy) say the same as py-spy's
        own = stacks.analyse({r: d["threads"] for r, d in dumps.items()})
        assert own.summary.startswith(summary_stacks), own.summary
        # what an agent ships for a `diagnose` request, compared as the job stage does
        note = asyncio.run(capture(proc.pid, tmp_path))
        assert note["armed"] == [0, 1] and not note["errors"], note["errors"]
        assert all(r["fr"] and r["source"] == "py-spy" for r in note["ranks"].values())
        found = verdict({"n0": {**note, "ts": time.time()}})
        assert found is not None and found.sentence.startswith(summary_fr), found.sentence
        assert 1 in found.culprits and found.basis == "flight recorder"
    finally:
        _kill_job(proc)


@pytest.mark.kafka
def test_diagnose_cli_asks_a_running_cluster_job(kafka_bootstrap: str, tmp_path: Path) -> None:
    """`faultwatch diagnose JOB` against a real processor and agent: the agent captures its
    torchrun ranks (py-spy, and the Flight Recorder the SDK armed) and the CLI prints who
    waits where. The job: rank 1 sleeps before the 6th all_reduce, rank 0 waits in it."""
    from tests.support.cluster import agent_cmd, processor, wait_processor_ready
    from tests.support.processes import faultwatch_exe

    prefix = f"e2ediag{os.getpid()}{int(time.time())}."
    job = "diag-cli"
    with processor(kafka_bootstrap, prefix, tmp_path / "processor.log") as proc:
        wait_processor_ready(kafka_bootstrap, prefix, proc, tmp_path / "processor.log")
        cmd = agent_cmd(kafka_bootstrap, prefix, job, "node-0",
                        [sys.executable, "-m", "torch.distributed.run", "--standalone",
                         "--nproc-per-node", "2", str(JOB)],
                        "--follow-decisions", "--spool-dir", str(tmp_path / "spool"))
        agent = subprocess.Popen(cmd, env=job_env(FW_SCENARIO="sleep"), text=True,
                                 stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                 start_new_session=True)
        out: list[str] = []
        ready: set[str] = set()
        both = threading.Event()

        def read() -> None:
            assert agent.stdout is not None
            for line in agent.stdout:
                out.append(line)
                ready.update(re.findall(r"ready (\d+)", line))
                if len(ready) == 2:
                    both.set()

        threading.Thread(target=read, daemon=True).start()
        try:
            assert both.wait(120), "".join(out[-30:])
            def diagnose() -> tuple[subprocess.CompletedProcess[str], dict]:
                res = subprocess.run([faultwatch_exe(), "diagnose", job, "--json",
                                      "--bootstrap", kafka_bootstrap, "--topic-prefix", prefix],
                                     capture_output=True, text=True, timeout=90, env=job_env())
                return res, json.loads(res.stdout) if res.returncode == 0 else {}

            def missing_named(got: tuple[subprocess.CompletedProcess[str], dict]) -> bool:
                rep = got[1]
                fr_groups = (rep.get("diagnosis") or {}).get("flight_recorder", {}).get("groups")
                return bool(fr_groups and fr_groups[0]["missing"])

            # the processor's status snapshot of the job comes every 3 s: until then (or
            # until rank 0 is inside the collective) the report names nobody
            res, rep = wait_until(diagnose, 60, "a report naming the missing rank",
                                  interval_s=2, until=missing_named, raise_on_timeout=False)
            assert res.returncode == 0, res.stderr + res.stdout
            assert rep["nodes_answered"] == ["node-0"] and rep["nodes_missing"] == []
            assert rep["culprit_ranks"] == [1] and rep["culprit_basis"] == "flight recorder"
            assert rep["summary"].startswith(
                "rank 0 waits in all_reduce #6 (3\u00d74 float); rank 1 never entered it"), rep
            assert "rank 1 is at collectives.py:" in rep["summary"]
            g = rep["diagnosis"]["flight_recorder"]["groups"][0]
            assert g["missing"] == [1] and g["waiting"] == [0]
            assert g["last"]["0"]["entered"] == 6 and g["last"]["1"]["entered"] == 5
            ranks = rep["diagnosis"]["stacks"]["ranks"]
            assert ranks["0"]["state"] == "collective" and ranks["0"]["op"] == "all_reduce"
            assert ranks["1"]["state"] == "elsewhere"
            assert ranks["1"]["at"].startswith("collectives.py:")
            text = subprocess.run([faultwatch_exe(), "diagnose", job, "--bootstrap",
                                   kafka_bootstrap, "--topic-prefix", prefix],
                                  capture_output=True, text=True, timeout=90, env=job_env())
            assert text.returncode == 0, text.stderr
            assert "rank 0: entered #6 completed #5 all_reduce #6" in text.stdout, text.stdout
            assert "rank 1: elsewhere at collectives.py:" in text.stdout, text.stdout
            gone = subprocess.run([faultwatch_exe(), "diagnose", "no-such-job", "--bootstrap",
                                   kafka_bootstrap, "--topic-prefix", prefix],
                                  capture_output=True, text=True, timeout=90, env=job_env())
            assert gone.returncode != 0 and "no processor reports job 'no-such-job'" \
                in gone.stderr, gone.stderr
        finally:
            ranks = rank_pids(agent.pid)
            os.killpg(agent.pid, signal.SIGTERM)
            try:
                agent.wait(30)
            except subprocess.TimeoutExpired:
                os.killpg(agent.pid, signal.SIGKILL)
                agent.wait(10)
            for pid in ranks.values():
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)


def test_ddp_gradient_all_reduce_inside_backward_is_seen_as_the_collective(tmp_path: Path
                                                                         ) -> None:
    """A real DDP job (gloo) whose rank 1 stops before a backward: rank 0 blocks in DDP's
    gradient all-reduce inside backward, where no torch.distributed Python frame is on its
    stack. The agent's capture (py-spy, native frames for the idle rank inside torch) must
    say rank 0 is in a collective and name rank 1 with its line."""
    marks = tmp_path / "marks.txt"
    env = job_env(FW_STALL_AT="10", FW_RANK="1", FW_MARKS=str(marks))
    proc = subprocess.Popen([sys.executable, "-m", "torch.distributed.run", "--standalone",
                             "--nproc-per-node", "2", str(JOBS / "ddp_stall.py")], env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            start_new_session=True)
    try:
        wait_until(lambda: marks.exists() and len(marks.read_text().splitlines()) >= 2, 120,
                   "both ranks' marks", interval_s=0.5, raise_on_timeout=False)
        assert marks.exists(), "the job never reached its stall"

        def captured() -> tuple[dict, Any]:
            note = asyncio.run(capture(proc.pid, None))
            return note, verdict({"n0": {**note, "ts": time.time()}})

        # rank 0 reaches the all-reduce a moment later
        note, found = wait_until(captured, 60, "a verdict naming a culprit", interval_s=1,
                                 until=lambda got: got[1] is not None and got[1].culprits,
                                 raise_on_timeout=False)
        assert found is not None and found.culprits == (1,), (found, note)
        assert found.basis == "stacks"
        r0 = note["ranks"]["0"]["stack"]
        assert r0["state"] == "collective" and r0["op"] == "DDP gradient all_reduce", r0
        assert r0["frames"][0].endswith("in _engine_run_backward"), r0
        assert found.sentence.startswith(
            "rank 0 in DDP gradient all_reduce; rank 1 is at ddp_stall.py:"), found.sentence
    finally:
        _kill_job(proc)
