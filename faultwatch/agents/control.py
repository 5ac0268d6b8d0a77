"""The control channel of the agent: diagnosis requests (probes) from <prefix>control.

Probes are machinery, not decisions: the job stage asks every agent of a silent job for its
ranks' stacks and Flight Recorder dumps (core/diagnosis.py) on the control topic, which
schedulers, `faultwatch decisions`, `faultwatch notify` and the actuators never read. During
an upgrade an older processor still sends them on the decisions topic: the supervisor hands
those here too (answer_probe), and a request seen on both paths is answered once (by id).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from faultwatch.agents.transport import Decisions
from faultwatch.core.diagnosis import is_probe
from faultwatch.core.events import Decision

if TYPE_CHECKING:
    from faultwatch.agents.agent import Agent

MAX_SEEN = 1024  # request ids remembered for dedupe


def answer_probe(agent: Agent, dec: Decision, via: str) -> bool:
    """Capture this node's ranks for a probe of this attempt; False when it is not one for us
    (another attempt or node, already answered, no child running)."""
    if not is_probe(dec) or dec.attempt != agent.attempt:
        return False
    if dec.nodes and agent.cfg.node not in dec.nodes:
        return False
    if dec.id in agent.probes_seen:  # the same request on the other path: answered once
        agent.log("probe_seen_again", id=dec.id, via=via)
        return False
    if len(agent.probes_seen) >= MAX_SEEN:
        agent.probes_seen.clear()
    agent.probes_seen.add(dec.id)
    child = agent.child
    running = child is not None and child.returncode is None
    agent.log("probe", id=dec.id, attempt=dec.attempt, via=via,
              answering=running and agent.diagnoser is not None)
    if running and agent.diagnoser is not None and child is not None:
        agent.diagnoser.on_decision(dec.id, child.pid)
    return True


async def answer_probes(agent: Agent, control: Decisions) -> None:
    """Run for the agent's life: answer every probe that arrives on the control channel."""
    while True:
        dec = await control.get()
        if dec is not None:
            answer_probe(agent, dec, "control")
