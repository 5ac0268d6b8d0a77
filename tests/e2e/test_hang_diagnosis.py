"""Naming the culprit of a real gloo hang: py-spy stacks and Flight Recorder dumps of real ranks."""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from faultwatch.agents.dumps import capture, rank_pids, request_rank_dumps, stacks_of
from faultwatch.core.diagnosis import verdict
from faultwatch.diagnose import flight_recorder, stacks
from tests.e2e.conftest import job_env

JOB = Path(__file__).parent / "jobs" / "collectives.py"
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


def _blocked(pids: dict[int, int]) -> None:
    """Wait until the ranks are parked: some rank inside a collective and the picture the
    same in three captures in a row."""
    deadline = time.monotonic() + 60
    seen: list[str] = []
    while time.monotonic() < deadline:
        st, _ = asyncio.run(stacks_of(pids))
        found = stacks.analyse(st)
        seen = (seen + [found.summary])[-3:]
        if found.in_collective and len(seen) == 3 and len(set(seen)) == 1:
            return
        time.sleep(0.3)
    raise AssertionError(f"the ranks never settled in a collective: {seen}")


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
        # torchrun starts its workers in sessions of their own: kill them too, or they
        # outlive the test (seen: orphaned ranks blocked in all_reduce)
        ranks = rank_pids(proc.pid)
        os.killpg(proc.pid, signal.SIGKILL)
        for pid in ranks.values():
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        proc.wait(30)
