"""The attempt loop: launch, watch decisions while the child runs, wait for one after it fails."""

from __future__ import annotations

import asyncio
import contextlib
import math
import time
from typing import TYPE_CHECKING

from faultwatch.agents.child import ExitStatus
from faultwatch.agents.config import EXIT_BLACKLISTED, EXIT_FAILED_BY_DECISION
from faultwatch.agents.decisions import BLACKLISTED, FAIL, NOTIFY, RESTART, verdict
from faultwatch.agents.transport import Decisions
from faultwatch.core.diagnosis import DIAGNOSE_KIND
from faultwatch.core.events import Decision

if TYPE_CHECKING:
    from faultwatch.agents.agent import Agent

Action = tuple[str, Decision]
MAX_RESTART_DELAY_S = 600.0


def _consider(agent: Agent, dec: Decision) -> Action | None:
    """Log a decision; return (verdict, decision) when this node must act on it."""
    v = verdict(dec, agent.cfg.node, agent.attempt)
    agent.log("decision", id=dec.id, action=dec.action, attempt=dec.attempt,
              kind=dec.kind, verdict=v or "ignored")
    if v == NOTIFY and dec.kind == DIAGNOSE_KIND and agent.diagnoser is not None \
            and (not dec.nodes or agent.cfg.node in dec.nodes) and agent.child is not None:
        agent.diagnoser.on_decision(dec.id, agent.child.pid)
    if v is None or v == NOTIFY:
        return None
    return v, dec


async def _watch_while_running(agent: Agent, run: asyncio.Task[ExitStatus],
                               follower: Decisions) -> tuple[Action | None, bool]:
    """Act on a decision that arrives while the child runs: (action, whether we stopped a
    running child). A decision that comes with the child's own exit stops nothing."""
    while not run.done():
        get = asyncio.create_task(follower.get())
        done, _ = await asyncio.wait({run, get}, return_when=asyncio.FIRST_COMPLETED)
        if get not in done:
            get.cancel()  # a queued decision stays queued for the wait after the exit
            break
        dec = get.result()
        act = _consider(agent, dec) if dec is not None else None
        if act is not None:
            child = agent.child
            running = child is not None and child.returncode is None
            if running:
                agent.log("stopping_child", reason=act[0], decision=act[1].id)
                await agent.stop_child()
            return act, running
    return None, False


async def _wait_after_failure(agent: Agent, follower: Decisions) -> Action | None:
    """The child failed: wait (bounded) for the job's decision, or for a signal."""
    wait_s = agent.cfg.decision_wait_s
    agent.log("waiting_for_decision", timeout_s=wait_s, attempt=agent.attempt)
    started = time.monotonic()
    deadline = started + wait_s
    while (left := deadline - time.monotonic()) > 0 and not agent.stopping.is_set():
        get = asyncio.create_task(follower.get(left))
        stop = asyncio.create_task(agent.stopping.wait())
        await asyncio.wait({get, stop}, return_when=asyncio.FIRST_COMPLETED)
        stop.cancel()
        if not get.done():
            get.cancel()
            return None
        dec = get.result()
        if dec is None:
            break
        act = _consider(agent, dec)
        if act is not None:
            return act
    agent.log("no_decision", waited_s=round(time.monotonic() - started, 1))
    return None


async def run_attempt(agent: Agent, follower: Decisions | None
                      ) -> tuple[ExitStatus, Action | None, bool]:
    """One launch of the child: (its status, the decision acted on, whether we stopped it)."""
    run = asyncio.create_task(agent.supervise())
    act: Action | None = None
    stopped = False
    if follower is not None:
        act, stopped = await _watch_while_running(agent, run, follower)
    st = await run
    if act is None and follower is not None and st.exit_code != 0 \
            and not agent.stopping.is_set():
        act = await _wait_after_failure(agent, follower)
    return st, act, stopped


async def _wait_not_before(agent: Agent, dec: Decision) -> bool:
    """Honour a restart's evidence.restart_not_before (the processor's backoff; capped at
    MAX_RESTART_DELAY_S against clock skew). False when the agent was signalled first."""
    nb = dec.evidence.get("restart_not_before") if isinstance(dec.evidence, dict) else None
    if not isinstance(nb, (int, float)) or not math.isfinite(nb):
        return not agent.stopping.is_set()
    delay = min(float(nb) - time.time(), MAX_RESTART_DELAY_S)
    if delay > 0:
        agent.log("restart_backoff", decision=dec.id, delay_s=round(delay, 3))
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(agent.stopping.wait(), delay)
    return not agent.stopping.is_set()


async def supervise_job(agent: Agent) -> int:
    """Run the child, relaunching it on restart decisions; the agent's exit code."""
    from faultwatch.agents.prelaunch import before_launch

    follower = agent.transport.decisions
    while True:
        code = await before_launch(agent)
        if code is not None:
            return code
        st, act, stopped = await run_attempt(agent, follower)
        if act is None:
            if st.exit_code != 0:
                agent.log("child_exit", exit_code=st.exit_code, signal=st.signal)
            return st.exit_code
        v, dec = act
        if v == RESTART and await _wait_not_before(agent, dec):
            agent.log("restart", decision=dec.id, next_attempt=agent.attempt + 1)
            agent.restart()
            continue
        if v == BLACKLISTED:
            agent.log("blacklisted", decision=dec.id, exit_code=EXIT_BLACKLISTED)
            return EXIT_BLACKLISTED
        if v == FAIL and stopped:
            agent.log("failed_by_decision", decision=dec.id)
            return EXIT_FAILED_BY_DECISION
        return st.exit_code or EXIT_FAILED_BY_DECISION
