"""The fleet bench splits an event loop's wall time into on a CPU / waiting for a CPU / asleep:
a worker below a core that was runnable the rest of the time was starved by the machine."""

from __future__ import annotations

import os
import sys
import threading
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def fc():  # type: ignore[no-untyped-def]
    sys.path.insert(0, str(REPO / "bench"))
    try:
        import fleet_common
    finally:
        sys.path.remove(str(REPO / "bench"))
    return fleet_common


def test_schedstat_is_on_cpu_then_run_queue_nanoseconds(fc) -> None:  # type: ignore[no-untyped-def]
    assert fc.parse_schedstat("2500000000 1500000000 42\n") == (2.5, 1.5)


def test_a_starved_thread_is_told_from_a_sleeping_one(fc) -> None:  # type: ignore[no-untyped-def]
    starved = fc.sched_shares((10.0, 4.0), (15.5, 8.0), 10.0)  # 55 % on a CPU, 40 % queued
    assert starved == {"on_cpu_pct": 55.0, "waiting_for_cpu_pct": 40.0, "asleep_pct": 5.0}
    idle = fc.sched_shares((10.0, 4.0), (15.5, 4.1), 10.0)  # the same CPU, queued 1 %
    assert idle == {"on_cpu_pct": 55.0, "waiting_for_cpu_pct": 1.0, "asleep_pct": 44.0}
    assert fc.sched_shares(None, (1.0, 1.0), 1.0) is None


def test_machine_shares_from_proc_stat_counters(fc) -> None:  # type: ignore[no-untyped-def]
    #        user nice system idle iowait irq softirq steal guest guest_nice
    before = [100, 0, 10, 500, 5, 0, 0, 10, 0, 0]
    after = [250, 0, 30, 520, 5, 0, 0, 30, 0, 0]  # 210 ticks: 170 busy, 20 idle, 20 stolen
    got = fc.machine_shares(before, after)
    assert got is not None
    assert (got["idle_pct"], got["steal_pct"], got["iowait_pct"]) == (9.5, 9.5, 0.0)
    assert got["busy_cores"] == round((os.cpu_count() or 1) * 170 / 210, 2)


@pytest.mark.skipif(not Path("/proc/self/schedstat").exists(), reason="Linux /proc only")
def test_this_threads_own_accounting_moves_with_its_work(fc) -> None:  # type: ignore[no-untyped-def]
    """On the real /proc: a thread that spins gains on-CPU time, one that sleeps does not."""
    tid: list[int] = []
    started, stop = threading.Event(), threading.Event()

    def sleeper() -> None:
        tid.append(threading.get_native_id())
        started.set()
        stop.wait(5)

    t = threading.Thread(target=sleeper)
    t.start()
    assert started.wait(5)
    me = threading.get_native_id()
    a, sa = fc.thread_sched_s(os.getpid(), me), fc.thread_sched_s(os.getpid(), tid[0])
    end = time.thread_time() + 0.2
    while time.thread_time() < end:  # 0.2 CPU s spent by this thread
        pass
    b, sb = fc.thread_sched_s(os.getpid(), me), fc.thread_sched_s(os.getpid(), tid[0])
    stop.set()
    t.join()
    assert a is not None and b is not None and sa is not None and sb is not None
    assert b[0] - a[0] >= 0.15
    assert sb[0] - sa[0] < 0.05
    assert fc.thread_sched_s(os.getpid(), 1 << 30) is None  # no such thread
