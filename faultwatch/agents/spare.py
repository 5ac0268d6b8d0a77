"""A hot spare agent: check the node, register, wait without the command, join on a swap.

The spare registers with a `spare` note, runs its boot checks (a waiting spare's `bootcheck`
note says `when: spare`: it blames no job), then sends a `spare` note every `spare_note_s`
(core/spares.py folds them: registration, checks and liveness) while it follows the job's
decisions. It leaves the wait when:

- a restart or blacklist decision's `swaps` names it: it takes this node's spare lock (no
  other job's spare may start here) and becomes an active agent of the decision's next
  attempt (the supervisor launches the command);
- a `fail` decision ends the job (exit 78), the processor's status snapshot shows its run
  done (`released`, exit 0), or the agent is signalled (128+N).

The node lock is a file per node name under $FAULTWATCH_LOCK_DIR (default the temporary
directory) held with flock by the spare that joined; a spare of another job on the same node
says `busy` in its notes (never chosen) and declines a swap it cannot lock.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import os
import socket
import tempfile
import time
import uuid
from pathlib import Path
from typing import TYPE_CHECKING

from faultwatch import settings, wire
from faultwatch.agents.config import safe_name
from faultwatch.agents.roles import endpoint_host, hosts_rendezvous, rendezvous_endpoint
from faultwatch.core.events import Decision
from faultwatch.errors import DecodeError
from faultwatch.kafka import clients

if TYPE_CHECKING:
    from faultwatch.agents.agent import Agent

SPARE_NOTE = "spare"
STATUS_MARGIN_S = 60.0  # read status snapshots from this long before the spare started
MAX_BACKOFF_S = 10.0


# ---- the node lock -------------------------------------------------------------------------

class NodeLock:
    """The spare lock of one node name: held by the spare that joined a job here."""

    def __init__(self, node: str, lock_dir: str | None = None) -> None:
        base = lock_dir or settings.LOCK_DIR.raw() or tempfile.gettempdir()
        self.path = Path(base) / f"faultwatch-spare-{safe_name(node)}.lock"
        self.fd: int | None = None

    def _open(self) -> int | None:
        try:
            return os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        except OSError:
            return None  # another user's lock file: taken

    def holder(self) -> str:
        """Who holds the lock now ("" when free or held by us)."""
        if self.fd is not None:
            return ""
        fd = self._open()
        if fd is None:
            return "unknown (lock file not writable)"
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            with contextlib.suppress(OSError):
                return os.pread(fd, 300, 0).decode(errors="replace").strip() or "unknown"
            return "unknown"
        else:
            fcntl.flock(fd, fcntl.LOCK_UN)
            return ""
        finally:
            os.close(fd)

    def acquire(self, who: str) -> bool:
        """Take the lock for good (released when the process ends); False when held."""
        if self.fd is not None:
            return True
        fd = self._open()
        if fd is None:
            return False
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            os.close(fd)
            return False
        os.ftruncate(fd, 0)
        os.pwrite(fd, who.encode()[:300], 0)
        self.fd = fd
        return True


# ---- notes ---------------------------------------------------------------------------------

async def active_note(agent: Agent) -> None:
    """Before each launch an active agent says whether it hosts the launch's rendezvous
    (the processor never swaps that node out for a hot spare: agents/roles.py); nothing
    when the launch names no shared endpoint (no torchrun, --standalone, loopback)."""
    c = agent.cfg
    endpoint = rendezvous_endpoint(c.cmd, agent.child_env())
    if endpoint is None or hosts_rendezvous(endpoint, (), (), ()) is None:
        return
    ours: list[str] = []
    theirs: list[str] = []
    with contextlib.suppress(TimeoutError):  # a resolver that hangs never holds a launch
        ours, theirs = await asyncio.wait_for(
            asyncio.to_thread(_addresses, endpoint_host(endpoint)), 2.0)
    host = hosts_rendezvous(endpoint, (socket.gethostname(), c.node), ours, theirs)
    agent.note(SPARE_NOTE, {"role": "active", "rdzv_host": host})


def _addresses(host: str) -> tuple[list[str], list[str]]:
    """(this machine's canonical names and addresses, `host`'s addresses), resolved as
    torchrun resolves them to decide which process serves the c10d store."""
    ours: set[str] = set()
    with contextlib.suppress(OSError, ValueError):
        for info in socket.getaddrinfo(socket.gethostname(), None, proto=socket.IPPROTO_TCP,
                                       flags=socket.AI_CANONNAME):
            ours.update(x for x in (str(info[3]), str(info[4][0])) if x)
    theirs: set[str] = set()
    with contextlib.suppress(OSError, ValueError):
        theirs.update(str(i[4][0]) for i in socket.getaddrinfo(host, None,
                                                                proto=socket.IPPROTO_TCP))
    return sorted(ours), sorted(theirs)


def _spare_note(agent: Agent, state: str, checks: str, failed: list[str], busy: str) -> None:
    agent.note(SPARE_NOTE, {"role": "spare", "state": state, "checks": checks,
                            "failed": failed[:16], "busy": busy, "host": socket.gethostname()})


def next_nodes(dec: Decision) -> int:
    """How many nodes run the attempt after a swap: the blacklist's restart_nodes, or the
    restart's targets. Each of them waits for the others' hellos before it launches
    (prelaunch): a spare's torchrun must never meet the rendezvous store of the attempt
    being replaced, which lives until the survivors have stopped their commands."""
    others = dec.evidence.get("restart_nodes") if isinstance(dec.evidence, dict) else None
    if dec.action == "blacklist" and isinstance(others, list):
        return len({n for n in others if isinstance(n, str)})
    return len(set(dec.nodes))


def swapped_in(dec: Decision, node: str) -> str | None:
    """The node this spare replaces when `dec` swaps it in, else None."""
    if dec.action not in ("restart", "blacklist"):
        return None
    return next((a for a, b in dec.swaps if b == node), None)


# ---- the run's end -------------------------------------------------------------------------

def run_done(value: bytes, job: str, run_id: str) -> bool:
    """Whether a status-topic record says this run of `job` is done."""
    try:
        d = wire.decode_status(value)
    except DecodeError:
        return False
    return bool(d.get("job") == job and d.get("run_id") == run_id and d.get("phase") == "done")


async def watch_run_done(agent: Agent, done: asyncio.Event) -> None:
    """Follow the job's partition of <prefix>status until a snapshot shows this run done
    (a missing topic is waited for; a broker outage retried with back-off)."""
    from aiokafka import TopicPartition  # type: ignore[import-untyped,unused-ignore]
    from aiokafka.partitioner import murmur2  # type: ignore[import-untyped,unused-ignore]

    c = agent.cfg
    topic = c.topics.status
    key = wire.job_key(c.job)
    since_ms = int((time.time() - STATUS_MARGIN_S) * 1000)
    backoff = 0.5
    nxt: int | None = None
    while not done.is_set():
        consumer = clients.consumer(bootstrap_servers=c.bootstrap, group_id=None,
                                    enable_auto_commit=False, request_timeout_ms=15000,
                                    auto_offset_reset="earliest",
                                    client_id=f"faultwatch-spare-{uuid.uuid4().hex[:6]}")
        try:
            await asyncio.wait_for(consumer.start(), 20)
            parts: list[int] = []
            while not parts:
                await consumer._client.force_metadata_update()  # noqa: SLF001
                parts = sorted(consumer.partitions_for_topic(topic) or ())
                if not parts:
                    await asyncio.sleep(1.0)
            tp = TopicPartition(topic, parts[(murmur2(key) & 0x7FFFFFFF) % len(parts)])
            consumer.assign([tp])
            if nxt is None:
                found = (await consumer.offsets_for_times({tp: since_ms})).get(tp)
                nxt = found.offset if found is not None \
                    else (await consumer.end_offsets([tp]))[tp]
            consumer.seek(tp, nxt)
            backoff = 0.5
            while not done.is_set():
                batch = await consumer.getmany(timeout_ms=1000)
                for msgs in batch.values():
                    for m in msgs:
                        nxt = m.offset + 1
                        if m.key == key and m.value and run_done(m.value, c.job, agent.run_id):
                            done.set()
        except asyncio.CancelledError:
            raise
        except Exception as e:  # noqa: BLE001 - broker away: retry, the spare waits on
            agent.log("spare_status_unavailable", topic=topic, error=repr(e)[:200])
        finally:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(consumer.stop(), 5)
        if not done.is_set():
            await asyncio.sleep(backoff)
            backoff = min(backoff * 2, MAX_BACKOFF_S)


# ---- the wait ------------------------------------------------------------------------------

async def _checks(agent: Agent) -> tuple[str, list[str]]:
    """The spare's boot checks: (passed | failed | off, the names of failed checks)."""
    if not agent.cfg.bootcheck:
        return "off", []
    from faultwatch.agents.bootcheck import FAIL, bootchecks

    ok, checks = await bootchecks(agent, "spare")
    return ("passed" if ok else "failed"), [str(x.get("name")) for x in checks
                                            if x.get("status") == FAIL]


async def wait_as_spare(agent: Agent) -> tuple[str, Decision | None]:
    """Wait as a spare. Returns ("joined", decision) once swapped in (agent.attempt is the
    decision's next attempt), ("failed", decision) on a fail decision, ("released", None)
    when the run is done, ("interrupted", None) when the agent was signalled."""
    c = agent.cfg
    follower = agent.transport.decisions
    assert follower is not None  # AgentConfig refuses a spare that follows no decisions
    lock = NodeLock(c.node)
    agent.log("spare_waiting", role=agent.role.why or "spare", note_s=c.spare_note_s)
    if c.bootcheck:  # registered at once: a spare still checking is never chosen
        _spare_note(agent, "waiting", "running", [], lock.holder())
    checks, failed = await _checks(agent)
    done = asyncio.Event()
    watch = asyncio.create_task(watch_run_done(agent, done), name="faultwatch-spare-status")
    try:
        while True:
            busy = lock.holder()
            _spare_note(agent, "waiting", checks, failed, busy)
            deadline = time.monotonic() + c.spare_note_s
            while (left := deadline - time.monotonic()) > 0:
                if agent.stopping.is_set():
                    _spare_note(agent, "leaving", checks, failed, busy)
                    return "interrupted", None
                if done.is_set():
                    _spare_note(agent, "leaving", checks, failed, busy)
                    agent.log("spare_released", reason="the run is done")
                    return "released", None
                dec = await follower.get(min(left, 0.5))
                if dec is None:
                    continue
                outcome = _on_decision(agent, dec, lock, checks, failed)
                if outcome is not None:
                    return outcome, dec
    finally:
        watch.cancel()
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await watch


def _on_decision(agent: Agent, dec: Decision, lock: NodeLock, checks: str,
                 failed: list[str]) -> str | None:
    c = agent.cfg
    replaced = swapped_in(dec, c.node)
    agent.log("decision", id=dec.id, action=dec.action, attempt=dec.attempt, kind=dec.kind,
              verdict="join" if replaced else ("fail" if dec.action == "fail" else "ignored"),
              role="spare")
    agent.story.add(dec, "join" if replaced else dec.action if dec.action == "fail"
                    else "ignored")
    if dec.action == "fail":
        _spare_note(agent, "leaving", checks, failed, "")
        return "failed"
    if replaced is None:
        return None
    who = f"job {c.job} run {agent.run_id} pid {os.getpid()}"
    if not lock.acquire(who):
        busy = lock.holder() or "another process"
        agent.log("spare_declined", decision=dec.id, replacing=replaced, busy=busy)
        _spare_note(agent, "declined", checks, failed, busy)
        return None
    agent.attempt = dec.attempt + 1
    agent.sync_nodes = next_nodes(dec)
    agent.log("spare_joining", decision=dec.id, replacing=replaced, attempt=agent.attempt,
              nodes=agent.sync_nodes)
    return "joined"
