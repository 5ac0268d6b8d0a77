"""The attempt loop: launch, watch decisions while the child runs, wait for one after it fails."""

from __future__ import annotations

import asyncio
import time
from typing import TYPE_CHECKING

from faultwatch.agents.child import ExitStatus
from faultwatch.agents.config import EXIT_BLACKLISTED, EXIT_FAILED_BY_DECISION
from faultwatch.agents.decisions import (
    BLACKLISTED,
    FAIL,
    NOTIFY,
    RESTART,
    DecisionFollower,
    verdict,
)
from faultwatch.core.events import Decision

if TYPE_CHECKING:
    from faultwatch.agents.agent import Agent

Action = tuple[str, Decision]


def _consider(agent: Agent, dec: Decision) -> Action | None:
    """Log a decision; return (verdict, decision) when this node must act on it."""
    v = verdict(dec, agent.cfg.node, agent.attempt)
    agent.log("decision", id=dec.id, action=dec.action, attempt=dec.attempt,
              kind=dec.kind, verdict=v or "ignored")
    if v is None or v == NOTIFY:
        return None
    return v, dec


async def _watch_while_running(agent: Agent, run: asyncio.Task[ExitStatus],
                               follower: DecisionFollower) -> Action | None:
    """Act on a decision that arrives while the child runs (stop its group); else None."""
    while not run.done():
        get = asyncio.create_task(follower.get())
        done, _ = await asyncio.wait({run, get}, return_when=asyncio.FIRST_COMPLETED)
        if get not in done:
            get.cancel()  # a queued decision stays queued for the wait after the exit
            break
        dec = get.result()
        act = _consider(agent, dec) if dec is not None else None
        if act is not None:
            agent.log("stopping_child", reason=act[0], decision=act[1].id)
            await agent.stop_child()
            return act
    return None


async def _wait_after_failure(agent: Agent, follower: DecisionFollower) -> Action | None:
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


async def run_attempt(agent: Agent, follower: DecisionFollower | None
                      ) -> tuple[ExitStatus, Action | None, bool]:
    """One launch of the child: (its status, the decision acted on, whether we stopped it)."""
    run = asyncio.create_task(agent.supervise())
    act: Action | None = None
    if follower is not None:
        act = await _watch_while_running(agent, run, follower)
    st = await run
    stopped = act is not None
    if act is None and follower is not None and st.exit_code != 0 \
            and not agent.stopping.is_set():
        act = await _wait_after_failure(agent, follower)
    return st, act, stopped


async def supervise_job(agent: Agent) -> int:
    """Run the child, relaunching it on restart decisions; the agent's exit code."""
    from faultwatch.agents.prelaunch import before_launch

    cfg = agent.cfg
    follower: DecisionFollower | None = None
    if cfg.follow_decisions:
        follower = DecisionFollower(cfg.bootstrap, cfg.decisions_topic, cfg.job, agent.log)
        follower.start()
        await follower.wait_ready(cfg.decisions_ready_timeout_s)  # positioned before the child
    try:
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
            if v == RESTART and not agent.stopping.is_set():
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
    finally:
        if follower is not None:
            await follower.close()
