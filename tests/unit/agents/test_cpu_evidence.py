"""What the agent gathers beside the stacks: a rank's scheduler state and the CPU seconds of
its process tree (its data-loader and compile workers work for it), from /proc."""

from __future__ import annotations

import subprocess
import sys

from faultwatch.agents import dumps
from tests.support.waiting import wait_until

BURN_IN_A_CHILD = ("import subprocess, sys, time; "
                   "subprocess.Popen([sys.executable, '-c', 'while True: pass']); "
                   "time.sleep(60)")


def test_a_sleeping_rank_with_a_busy_worker_uses_cpu_through_its_tree() -> None:
    parent = subprocess.Popen([sys.executable, "-c", BURN_IN_A_CHILD])
    try:
        def worked() -> dict[int, tuple[float | None, str | None, int]] | None:
            got = dumps.cpu_sample({0: parent.pid})
            own, tree = dumps.cpu_seconds(parent.pid), got[0][0]
            return got if tree is not None and own is not None and tree - own >= 0.3 else None

        got = wait_until(worked, 30, "the worker's CPU seconds in its rank's tree")
        tree, state, _ = got[0]
        own = dumps.cpu_seconds(parent.pid)
        assert state == "S"  # the rank itself sleeps
        assert dumps.running_descendants(parent.pid, dumps.children_map()) == 1  # its worker
        assert tree is not None and own is not None and tree - own >= 0.3, (tree, own)
    finally:
        kids = dumps.children_map().get(parent.pid, [])
        for k in kids:
            subprocess.run(["kill", str(k)], check=False)
        parent.kill()
        parent.wait()
    assert dumps.proc_state(parent.pid) is None  # gone: nothing
    assert dumps.cpu_sample({0: parent.pid})[0] == (None, None, 0)
