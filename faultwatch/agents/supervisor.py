"""The attempt loop: launch, watch decisions while the child runs, wait for one after it fails."""

from __future__ import annotations

import asyncio
import contextlib
import math
import signal
import time
from typing import TYPE_CHECKING

import orjson

from faultwatch.agents.child import ExitStatus
from faultwatch.agents.control import answer_probe, refused_why
from faultwatch.agents.decisions import BLACKLISTED, NOTIFY, REPLACED, RESTART, verdict
from faultwatch.agents.exitcodes import (
    EXIT_ELSEWHERE,
    EXIT_FAILED,
    EXIT_NODES_TIMEOUT,
    EXIT_RESTART,
    EXIT_SUCCESS,
    EXIT_UNDECIDED,
    Verdict,
    decision_summary,
    signal_name,
)
from faultwatch.agents.transport import Decisions
from faultwatch.core.diagnosis import is_probe
from faultwatch.core.events import Decision
from faultwatch.wire import decision_to_dict

if TYPE_CHECKING:
    from faultwatch.agents.agent import Agent

Action = tuple[str, Decision]
MAX_RESTART_DELAY_S = 600.0


def _consider(agent: Agent, dec: Decision) -> Action | None:
    """Log a decision; return (verdict, decision) when this node must act on it. A probe
    on the decisions topic (an older processor's) is answered, never acted on."""
    if is_probe(dec):
        answer_probe(agent, dec, "decisions")
        return None
    v = verdict(dec, agent.cfg.node, agent.attempt)
    agent.log("decision", id=dec.id, action=dec.action, attempt=dec.attempt,
              kind=dec.kind, verdict=v or "ignored")
    agent.story.add(dec, v or "ignored")
    if v is not None and agent.render is not None:  # one readable block per decision this
        agent.log_plain(agent.render(dec, agent.tee_err_is_terminal))  # node acts on or reads
    _record(agent, dec)
    if v is None or v == NOTIFY:
        return None
    return v, dec


def _record(agent: Agent, dec: Decision) -> None:
    """--decisions-out: the job's decisions this agent read, one JSON line each."""
    path = agent.cfg.decisions_out
    if path is None:
        return
    try:
        with open(path, "ab") as f:
            f.write(orjson.dumps(decision_to_dict(dec)) + b"\n")
    except OSError as e:
        agent.log("decisions_out_failed", path=path, error=str(e)[:300])


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


def _verdict(agent: Agent, name: str, code: int, st: ExitStatus | None, why: str = "",
             dec: Decision | None = None, **kw: object) -> Verdict:
    c = agent.cfg
    return Verdict(name, code, why=why, child_exit_code=st.exit_code if st else None,
                   child_signal=st.signal if st else None,
                   decision=decision_summary(dec) if dec is not None else None, job=c.job,
                   node=c.node, run_id=agent.run_id, attempt=agent.attempt, **kw)  # type: ignore[arg-type]


def _interrupted(agent: Agent, st: ExitStatus | None, dec: Decision | None = None) -> Verdict:
    sig = agent.signals[-1] if agent.signals else int(signal.SIGTERM)
    return _verdict(agent, "interrupted", 128 + sig, st,
                    f"the agent received {signal_name(sig)} and stopped its command", dec,
                    agent_signal=sig)


def _before_launch_verdict(agent: Agent, code: int) -> Verdict:
    if code == EXIT_NODES_TIMEOUT:
        return _verdict(agent, "nodes-timeout", code, None,
                        "the job's other nodes did not come up within --wait-for-nodes-timeout-s")
    if code == EXIT_ELSEWHERE:
        return _verdict(agent, "elsewhere", code, None,
                        "a boot check failed (--bootcheck-abort): this node is bad")
    return _interrupted(agent, None)


async def _wait_as_spare(agent: Agent) -> Verdict | None:
    """A hot spare waits (agents/spare.py): None once it joins the job (its attempt is the
    swap's next one), else the verdict it leaves with."""
    from faultwatch.agents.spare import wait_as_spare

    outcome, dec = await wait_as_spare(agent)
    if dec is not None:
        _record(agent, dec)
    if outcome == "joined" and dec is not None:
        if not await _wait_not_before(agent, dec):
            return _interrupted(agent, None, dec)
        return None
    if outcome == "failed":
        return _verdict(agent, "failed", EXIT_FAILED, None,
                        "a fail decision ended the job while this spare waited", dec)
    if outcome == "released":
        return _verdict(agent, "released", EXIT_SUCCESS, None,
                        "the run is done; this hot spare was not needed")
    return _interrupted(agent, None)


async def supervise_job(agent: Agent) -> Verdict:
    """Run the child, relaunching it on restart decisions; the agent's verdict (its exit code
    is the contract of agents/exitcodes.py: never the child's own code)."""
    from faultwatch.agents.prelaunch import before_launch

    follower = agent.transport.decisions
    if agent.role.spare:
        waited = await _wait_as_spare(agent)
        if waited is not None:
            return waited
    while True:
        code = await before_launch(agent)
        if code is not None:
            return _before_launch_verdict(agent, code)
        st, act, stopped = await run_attempt(agent, follower)
        if agent.stopping.is_set() and (act is not None or st.exit_code != 0):
            # the agent was told to stop (scheduler, person): that is why the command ended,
            # whatever was decided about the end it caused
            agent.log("child_exit", exit_code=st.exit_code, signal=st.signal)
            return _interrupted(agent, st, act[1] if act is not None else None)
        if act is None:
            if st.exit_code == 0:
                return _verdict(agent, "success", EXIT_SUCCESS, st)
            agent.log("child_exit", exit_code=st.exit_code, signal=st.signal)
            why = (f"no decision arrived within {agent.cfg.decision_wait_s:g}s"
                   if follower is not None else "this agent does not follow decisions")
            if agent.refused is not None:  # why no decision came: the records never counted
                why += f"; {refused_why(agent)}"
            return _verdict(agent, "undecided", EXIT_UNDECIDED, st, why)
        v, dec = act
        if v == RESTART:
            if not await _wait_not_before(agent, dec):
                return _interrupted(agent, st, dec)
            if agent.cfg.on_restart == "exit":
                agent.log("restart_by_exit", decision=dec.id, next_attempt=agent.attempt + 1,
                          exit_code=EXIT_RESTART)
                return _verdict(agent, "restart", EXIT_RESTART, st,
                                "relaunch this agent here with the next attempt", dec,
                                next_attempt=agent.attempt + 1)
            agent.log("restart", decision=dec.id, next_attempt=agent.attempt + 1)
            agent.restart()
            if dec.swaps:  # a hot spare joins: launch together (agents/spare.py next_nodes)
                from faultwatch.agents.spare import next_nodes

                agent.sync_nodes = next_nodes(dec)
            continue
        if v == REPLACED:
            spare = next((b for a, b in dec.swaps if a == agent.cfg.node), "?")
            agent.log("replaced", decision=dec.id, spare=spare, exit_code=EXIT_SUCCESS)
            return _verdict(agent, "replaced", EXIT_SUCCESS, st,
                            f"hot spare {spare} took this node's place; the job runs on "
                            "without it", dec)
        if v == BLACKLISTED:
            agent.log("blacklisted", decision=dec.id, exit_code=EXIT_ELSEWHERE)
            return _verdict(agent, "elsewhere", EXIT_ELSEWHERE, st,
                            "a blacklist decision named this node: run the job elsewhere", dec)
        agent.log("failed_by_decision", decision=dec.id, stopped_child=stopped)
        return _verdict(agent, "failed", EXIT_FAILED, st,
                        "a fail decision: permanent" + (", the running command was stopped"
                                                         if stopped else ""), dec)
