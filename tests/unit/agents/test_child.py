"""Child: real subprocesses, exit codes, 128+N on signals, SIGTERM escalation, groups."""

from __future__ import annotations

import asyncio
import fcntl
import os
import signal
import sys
import time
from pathlib import Path

import pytest

from faultwatch.agents.child import PIPE_BYTES, Child, ExitStatus
from faultwatch.errors import ChildError
from tests.support.waiting import wait_until, wait_until_async


def _run(coro):  # type: ignore[no-untyped-def]
    return asyncio.run(asyncio.wait_for(coro, 30))


def test_exit_code_and_output() -> None:
    async def main() -> tuple[ExitStatus, bytes, bytes]:
        ch = await Child.spawn(["sh", "-c", "echo out; echo err >&2; exit 3"])
        out, err = await asyncio.gather(ch.stdout.read(), ch.stderr.read())
        st = await ch.wait()
        assert ch.returncode == 3
        return st, out, err

    st, out, err = _run(main())
    assert st == ExitStatus(3, None)
    assert out == b"out\n" and err == b"err\n"


def test_env_is_passed() -> None:
    async def main() -> bytes:
        ch = await Child.spawn(["sh", "-c", "echo $FW_X"], env={"FW_X": "hello", "PATH":
                                                              os.environ["PATH"]})
        out = await ch.stdout.read()
        await ch.wait()
        return out

    assert _run(main()) == b"hello\n"


def test_killed_by_signal_is_128_plus_n() -> None:
    async def main() -> ExitStatus:
        ch = await Child.spawn(["sh", "-c", "kill -9 $$"])
        return await ch.wait()

    assert _run(main()) == ExitStatus(128 + 9, 9)


def test_spawn_failure_raises_child_error() -> None:
    async def main() -> None:
        await Child.spawn(["/nonexistent/definitely-not-here", "x"])

    with pytest.raises(ChildError, match="definitely-not-here"):
        _run(main())


def test_own_process_group() -> None:
    async def main() -> None:
        ch = await Child.spawn([sys.executable, "-c", "import time; time.sleep(30)"])
        assert os.getpgid(ch.pid) == ch.pid != os.getpgid(0)
        st = await ch.stop(grace_s=5)
        assert st == ExitStatus(128 + signal.SIGTERM, signal.SIGTERM)

    _run(main())


def test_stop_escalates_to_sigkill_for_child_ignoring_sigterm() -> None:
    code = ("import signal, sys, time\n"
            "signal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
            "print('ready', flush=True)\n"
            "time.sleep(60)\n")

    async def main() -> tuple[ExitStatus, float]:
        ch = await Child.spawn([sys.executable, "-c", code])
        assert await ch.stdout.readline() == b"ready\n"
        t0 = time.monotonic()
        st = await ch.stop(grace_s=0.5)
        return st, time.monotonic() - t0

    st, took = _run(main())
    assert st == ExitStatus(128 + 9, 9)
    assert 0.4 <= took < 5


def test_trap_sigterm_and_exit_cleanly() -> None:
    async def main() -> ExitStatus:
        ch = await Child.spawn(["sh", "-c", "trap 'exit 7' TERM; echo ready; "
                                "while true; do sleep 0.05; done"])
        assert await ch.stdout.readline() == b"ready\n"
        return await ch.stop(grace_s=5)

    assert _run(main()) == ExitStatus(7, None)


def test_stop_kills_leftover_group_members() -> None:
    # The leader exits on SIGTERM; a grandchild ignoring SIGTERM must not survive stop().
    code = ("import os, signal, subprocess, sys, time\n"
            "p = subprocess.Popen([sys.executable, '-c', 'import signal, time; "
            "signal.signal(signal.SIGTERM, signal.SIG_IGN); print(1, flush=True); "
            "time.sleep(60)'])\n"
            "print(p.pid, flush=True)\n"
            "time.sleep(60)\n")

    async def main() -> int:
        ch = await Child.spawn([sys.executable, "-c", code])
        gpid = int(await ch.stdout.readline())
        assert await ch.stdout.readline() == b"1\n"
        st = await ch.stop(grace_s=0.5)
        assert st.signal == signal.SIGTERM
        await wait_until_async(lambda: not ch.group_alive(), 5, "the group gone",
                               raise_on_timeout=False)
        assert not ch.group_alive()
        return gpid

    gpid = _run(main())
    assert _dead(gpid)


def _dead(pid: int) -> bool:
    """Gone, or a zombie waiting for an init that reaps slowly (it no longer runs)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read()
    except FileNotFoundError:
        return True
    return stat[stat.rfind(b")") + 2:].split()[0] == b"Z"


def test_group_alive_ignores_zombies_of_a_slow_init() -> None:
    # The leader exits; its SIGKILLed member lingers as a zombie until init reaps it.
    async def main() -> tuple[bool, bool]:
        ch = await Child.spawn(["sh", "-c", "sleep 60 & echo $!; exit 0"])
        gpid = int(await ch.stdout.readline())
        await ch.wait()
        before = ch.group_alive()  # control: the member really runs
        os.kill(gpid, signal.SIGKILL)
        await wait_until_async(lambda: _dead(gpid), 2, f"member {gpid} dead", interval_s=0.02,
                               raise_on_timeout=False)
        return before, ch.group_alive()

    before, after = _run(main())
    assert before and not after


def test_signal_group_after_exit_is_ignored() -> None:
    async def main() -> None:
        ch = await Child.spawn(["true"])
        await ch.wait()
        ch.signal_group(signal.SIGTERM)
        assert await ch.stop(grace_s=0.1) == ExitStatus(0, None)

    _run(main())


def test_wait_returns_at_the_exit_while_a_setsid_grandchild_holds_the_pipes() -> None:
    # `setsid sleep 60 &` keeps stdout/stderr open in another session; the exit is the
    # leader's exit, not the pipes' closing (the control: the pipes are still open).
    async def main() -> tuple[ExitStatus, float, int, bool]:
        ch = await Child.spawn(["sh", "-c", "setsid sleep 60 & echo $!; sleep 0.5; exit 3"])
        gpid = int(await ch.stdout.readline())
        t0 = time.monotonic()
        st = await ch.wait()
        took = time.monotonic() - t0
        still_open = not ch.stdout.at_eof()
        ch.close_pipes()
        assert await asyncio.wait_for(ch.stdout.read(), 5) == b""
        return st, took, gpid, still_open

    st, took, gpid, still_open = _run(main())
    try:
        assert st == ExitStatus(3, None)
        assert took < 5
        assert still_open
        os.kill(gpid, 0)  # not ours to kill: it left the group
    finally:
        os.kill(gpid, signal.SIGKILL)


def test_escalation_kills_descendants_in_sessions_of_their_own(tmp_path: Path) -> None:
    """torchrun starts its workers with start_new_session: a SIGKILL of the child's group
    alone orphans them. stop() past the grace kills the whole tree (real processes)."""
    import subprocess
    import sys

    pidfile = tmp_path / "grandchild.pid"
    code = ("import os, signal, subprocess, sys, time\n"
            "signal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
            "g = subprocess.Popen([sys.executable, '-c', "
            "'import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
            "time.sleep(120)'], start_new_session=True)\n"
            f"open({str(pidfile)!r}, 'w').write(str(g.pid))\n"
            "time.sleep(120)\n")

    async def main() -> int:
        child = await Child.spawn([sys.executable, "-c", code])
        await wait_until_async(lambda: pidfile.exists() and pidfile.read_text(), 10,
                               "the grandchild's pid file", raise_on_timeout=False)
        grandchild = int(pidfile.read_text())
        assert os.getpgid(grandchild) != child.pgid  # really outside the child's group
        await child.stop(grace_s=0.5)
        return grandchild

    grandchild = asyncio.run(main())
    state = wait_until(  # reaped by init: gone, or a zombie for a moment
        lambda: subprocess.run(["ps", "-o", "stat=", "-p", str(grandchild)],
                               capture_output=True, text=True).stdout.strip(), 5,
        f"grandchild {grandchild} gone", interval_s=0.05,
        until=lambda state: not state or state.startswith("Z"), raise_on_timeout=False)
    assert not state or state.startswith("Z"), f"grandchild {grandchild} survived: {state}"


def test_the_childs_pipes_are_enlarged_so_a_burst_does_not_wait_for_the_agent() -> None:
    """Both pipes are grown to 1 MiB (a fresh pipe has 64 KiB), and asyncio reads up to that
    much per wakeup."""
    if int(Path("/proc/sys/fs/pipe-max-size").read_text()) < PIPE_BYTES:
        pytest.skip("pipe-max-size below 1 MiB on this machine")
    r, w = os.pipe()
    fresh = fcntl.fcntl(r, 1032)  # F_GETPIPE_SZ
    os.close(r)
    os.close(w)
    assert fresh < PIPE_BYTES  # the control: what the child would have had

    async def main() -> list[tuple[int, int]]:
        ch = await Child.spawn([sys.executable, "-c", "import time; time.sleep(0.5)"])
        sizes = []
        for fd in (1, 2):
            t = ch._transport.get_pipe_transport(fd)
            sizes.append((fcntl.fcntl(t.get_extra_info("pipe").fileno(), 1032), t.max_size))
        await asyncio.gather(ch.stdout.read(), ch.stderr.read())  # to EOF: pipes closed
        await ch.wait()
        return sizes

    assert _run(main()) == [(PIPE_BYTES, PIPE_BYTES)] * 2
