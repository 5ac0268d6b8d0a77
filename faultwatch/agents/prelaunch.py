"""Before each launch: boot checks (at the first launch and before every relaunch after a
failure: seed 001's troubleshooting) and waiting for the job's other agents (start skew)."""

from __future__ import annotations

import asyncio
import signal
import socket
import time
from collections.abc import Awaitable
from typing import TYPE_CHECKING, TypeVar

from faultwatch import wire
from faultwatch.agents.config import EXIT_BOOTCHECK_FAILED, EXIT_NODES_TIMEOUT
from faultwatch.agents.peers import hello_data, wait_for_nodes

if TYPE_CHECKING:
    from faultwatch.agents.agent import Agent

T = TypeVar("T")


async def _unless_stopped(agent: Agent, aw: Awaitable[T]) -> tuple[bool, T | None]:
    """(True, result) or (False, None) when the agent was signalled first."""
    task = asyncio.ensure_future(aw)
    stop = asyncio.create_task(agent.stopping.wait())
    await asyncio.wait({task, stop}, return_when=asyncio.FIRST_COMPLETED)
    stop.cancel()
    if task.done():
        return True, task.result()
    task.cancel()
    return False, None


def _signalled_code(agent: Agent) -> int:
    return 128 + (agent.signals[-1] if agent.signals else int(signal.SIGTERM))


async def _wait_nodes(agent: Agent, want: int) -> int | None:
    c = agent.cfg
    agent.transport.submit_lifecycle(
        wire.encode_notice(c.job, agent.attempt, c.node, time.time(), "hello",
                           hello_data(agent.run_id, c.node, c.rank, socket.gethostname(),
                                      agent.born_ts)),
        key=wire.job_key(c.job))
    agent.log("waiting_for_nodes", want=want, timeout_s=c.wait_for_nodes_timeout_s,
              attempt=agent.attempt)
    t0 = time.monotonic()
    ok, seen = await _unless_stopped(agent, wait_for_nodes(
        c.bootstrap, c.topic, c.job, agent.attempt, want, c.wait_for_nodes_timeout_s,
        agent.log))
    if not ok:
        return _signalled_code(agent)
    seen = seen or {}
    waited = round(time.monotonic() - t0, 1)
    if len(seen) < want:
        agent.log("nodes_timeout", want=want, up=len(seen), waited_s=waited,
                  nodes=",".join(sorted(seen)) or "-", exit_code=EXIT_NODES_TIMEOUT)
        agent.log_plain(f"faultwatch agent: only {len(seen)} of {want} nodes of job "
                        f"{c.job!r} came up within {c.wait_for_nodes_timeout_s:g}s "
                        f"(seen: {', '.join(sorted(seen)) or 'none'}); not launching. "
                        f"Exit code {EXIT_NODES_TIMEOUT}.")
        return EXIT_NODES_TIMEOUT
    ts = sorted(seen.values())
    agent.log("nodes_up", want=want, up=len(seen), waited_s=waited,
              skew_s=round(ts[-1] - ts[0], 3))
    return None


async def before_launch(agent: Agent) -> int | None:
    """None to launch the child now, else the agent's exit code (the launch is aborted)."""
    c = agent.cfg
    from faultwatch.agents.spare import active_note

    await active_note(agent)  # may a hot spare replace this node? (not if it hosts the rendezvous)
    if c.bootcheck:  # at every launch: the first, and each relaunch after a failure
        from faultwatch.agents.bootcheck import run_bootchecks

        when = "start" if agent.attempt == c.attempt else "restart"
        ok, passed = await _unless_stopped(agent, run_bootchecks(agent, when))
        if not ok:
            return _signalled_code(agent)
        if not passed and c.bootcheck_abort:
            agent.log("bootcheck_abort", exit_code=EXIT_BOOTCHECK_FAILED)
            return EXIT_BOOTCHECK_FAILED
    want = c.wait_for_nodes or agent.sync_nodes  # after a swap: the attempt's nodes
    agent.sync_nodes = 0
    if want > 0:
        return await _wait_nodes(agent, want)
    return None
