"""The supervised child process: spawned in its own process group, signalled as a group."""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import os
import signal as _signal
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from faultwatch.errors import ChildError

# Large stream-reader buffers so a burst of output is absorbed before the pipe pauses.
_READ_LIMIT = 1 << 20
# The child's pipes are enlarged to this (Linux F_SETPIPE_SZ, bounded by
# /proc/sys/fs/pipe-max-size, 1 MiB by default) so a burst of writes does not wait for us,
# and each wakeup reads up to this much.
PIPE_BYTES = 1 << 20
_F_SETPIPE_SZ = getattr(fcntl, "F_SETPIPE_SZ", 1031)


def enlarge_pipe(transport: asyncio.BaseTransport | None, size: int = PIPE_BYTES) -> int:
    """Grow a pipe to `size` bytes (or as much as allowed, halving down to 64 KiB) and let
    its asyncio read transport read that much per wakeup; the pipe's size (0 if unknown)."""
    if transport is None or transport.is_closing():
        return 0
    try:
        fd = transport.get_extra_info("pipe").fileno()
    except (AttributeError, ValueError, OSError):  # no pipe, or already closed (EOF seen)
        return 0
    got = 0
    while fd >= 0 and size >= 65536 and not got:
        try:
            got = fcntl.fcntl(fd, _F_SETPIPE_SZ, size)
        except OSError:  # EPERM over pipe-max-size, EBUSY, or not Linux
            size //= 2
    if got and hasattr(transport, "max_size"):
        with contextlib.suppress(AttributeError):
            transport.max_size = max(transport.max_size, got)  # asyncio's 256 KiB per read
    return got
_GROUP_POLL_S = 0.05


def children_map() -> dict[int, list[int]]:
    """Parent pid -> child pids of every process on this machine (read from /proc)."""
    kids: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as f:
                stat = f.read()
        except OSError:
            continue
        # pid (comm) state ppid ...: comm may hold spaces and parentheses
        rest = stat[stat.rfind(b")") + 2:].split()
        if len(rest) > 1:
            kids.setdefault(int(rest[1]), []).append(int(entry))
    return kids


def descendants(pid: int) -> list[int]:
    """Every live descendant of pid, whatever session or group it moved to."""
    kids = children_map()
    out: list[int] = []
    frontier = [pid]
    while frontier:
        nxt = [k for p in frontier for k in kids.get(p, ())]
        out.extend(nxt)
        frontier = nxt
    return out


class _ExitProtocol(asyncio.subprocess.SubprocessStreamProtocol):
    """The stock stream protocol plus a future resolved when the process itself exits.

    asyncio's Process.wait() resolves only once the pipes are closed too, so a grandchild
    holding them (`setsid sleep 60 &`) would delay the exit for as long as it lives."""

    def __init__(self, limit: int, loop: asyncio.AbstractEventLoop):
        super().__init__(limit=limit, loop=loop)
        self.exited: asyncio.Future[None] = loop.create_future()

    def process_exited(self) -> None:
        super().process_exited()
        if not self.exited.done():
            self.exited.set_result(None)


def _live_member(pgid: int) -> bool | None:
    """Whether a non-zombie process is in group pgid; None when /proc cannot tell."""
    try:
        pids = [e for e in os.listdir("/proc") if e.isdigit()]
    except OSError:
        return None
    for pid in pids:
        try:
            with open(f"/proc/{pid}/stat", "rb") as f:
                stat = f.read()
        except OSError:
            continue  # gone meanwhile
        fields = stat[stat.rfind(b")") + 2:].split()  # state ppid pgrp ...
        if len(fields) > 2 and fields[2] == str(pgid).encode() and fields[0] != b"Z":
            return True
    return False


@dataclass(frozen=True)
class ExitStatus:
    """How the child ended: exit_code as a shell reports it (128+N when killed by signal N)."""

    exit_code: int
    signal: int | None = None

    @classmethod
    def from_returncode(cls, rc: int) -> ExitStatus:
        if rc < 0:
            return cls(exit_code=128 - rc, signal=-rc)
        return cls(exit_code=rc, signal=None)


class Child:
    """A command running in its own session/process group with stdout and stderr piped."""

    def __init__(self, proc: asyncio.subprocess.Process, cmd: Sequence[str],
                 transport: asyncio.SubprocessTransport, protocol: _ExitProtocol):
        self._proc = proc
        self._transport = transport
        self._exited = protocol.exited
        self.cmd: tuple[str, ...] = tuple(cmd)
        self.pid: int = proc.pid
        self.pgid: int = proc.pid  # start_new_session=True makes the child its group's leader
        assert proc.stdout is not None and proc.stderr is not None
        self.stdout: asyncio.StreamReader = proc.stdout
        self.stderr: asyncio.StreamReader = proc.stderr
        self._status: ExitStatus | None = None

    @classmethod
    async def spawn(cls, cmd: Sequence[str], env: Mapping[str, str] | None = None) -> Child:
        """Start cmd with piped stdout/stderr, stdin from /dev/null, in a new session."""
        if not cmd:
            raise ChildError("cannot start child: empty command")
        loop = asyncio.get_running_loop()
        try:
            transport, protocol = await loop.subprocess_exec(
                lambda: _ExitProtocol(_READ_LIMIT, loop),
                *cmd,
                stdin=asyncio.subprocess.DEVNULL,
                stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.PIPE,
                env=dict(env) if env is not None else None,
                start_new_session=True,
            )
        except OSError as e:
            shown = repr(list(cmd))
            if len(shown) > 300:
                shown = shown[:300] + "...]"
            raise ChildError(f"cannot start {shown}: {e}") from e
        for fd in (1, 2):
            enlarge_pipe(transport.get_pipe_transport(fd))
        proc = asyncio.subprocess.Process(transport, protocol, loop)
        return cls(proc, cmd, transport, protocol)

    def pipe(self, fd: int) -> asyncio.ReadTransport | None:
        """The read transport of the child's stdout (1) or stderr (2) pipe."""
        t = self._transport.get_pipe_transport(fd)
        return t if isinstance(t, asyncio.ReadTransport) else None

    @property
    def returncode(self) -> int | None:
        """The raw returncode (negative signal number) once the leader exited, else None."""
        return self._proc.returncode

    async def wait(self) -> ExitStatus:
        """Wait for the group leader to exit and return its status (pipes may stay open)."""
        await asyncio.shield(self._exited)
        rc = self._proc.returncode
        assert rc is not None
        if self._status is None:
            self._status = ExitStatus.from_returncode(rc)
        return self._status

    def close_pipes(self) -> None:
        """Stop reading: close our ends of the pipes (a writer left behind gets EPIPE)."""
        self._transport.close()

    def signal_group(self, sig: int) -> None:
        """Send sig to every process of the child's group (gone groups are ignored)."""
        try:
            os.killpg(self.pgid, sig)
        except (ProcessLookupError, PermissionError):
            pass

    def kill_tree(self) -> None:
        """SIGKILL the group and every descendant of the leader, also those in sessions of
        their own (torchrun starts each worker with start_new_session: killing only the
        group would orphan the ranks). Call it while the leader lives (the tree is found
        through it)."""
        tree = descendants(self.pid) if self.returncode is None else []
        self.signal_group(_signal.SIGKILL)
        for pid in tree:
            try:
                os.kill(pid, _signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass

    def group_alive(self) -> bool:
        """Whether a live process (the leader or a leftover) is still in the child's group.

        Zombies do not count: an orphan reparented to an init that reaps slowly (as in many
        containers) would otherwise look alive until it is reaped."""
        try:
            os.killpg(self.pgid, 0)
        except (ProcessLookupError, PermissionError):
            return False
        live = _live_member(self.pgid)
        return True if live is None else live

    async def stop(self, grace_s: float = 10.0) -> ExitStatus:
        """SIGTERM the group; SIGKILL it after grace_s; also reap leftovers after the leader."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + grace_s
        if self.returncode is None:
            self.signal_group(_signal.SIGTERM)
            try:
                await asyncio.wait_for(self.wait(), timeout=grace_s)
            except TimeoutError:
                self.kill_tree()
        status = await self.wait()
        await self.kill_leftovers(max(0.0, deadline - loop.time()), term_first=False)
        return status

    async def kill_leftovers(self, grace_s: float = 0.0, term_first: bool = True) -> bool:
        """After the leader exited: give group members grace_s to go, then SIGKILL them.

        Returns True when some member had to be killed."""
        if not self.group_alive():
            return False
        if term_first:
            self.signal_group(_signal.SIGTERM)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + grace_s
        while loop.time() < deadline:
            await asyncio.sleep(_GROUP_POLL_S)
            if not self.group_alive():
                return False
        self.signal_group(_signal.SIGKILL)
        return True
