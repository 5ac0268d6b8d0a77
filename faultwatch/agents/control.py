"""The control channel of the agent: diagnosis requests (probes) from <prefix>control, and the
processors' notice that they refuse this node's records (streams/refusal_notices.py).

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
from faultwatch.trust.refusals import is_refusal

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


def note_refused(agent: Agent, dec: Decision) -> bool:
    """Keep a records-refused notice about this node (said once per reason now, and in the
    closing line of a run no decision came for); False when it names another node."""
    if dec.nodes and agent.cfg.node not in dec.nodes:
        return False
    ev = dec.evidence if isinstance(dec.evidence, dict) else {}
    before = agent.refused.evidence.get("reason") if agent.refused is not None else None
    agent.refused = dec
    if ev.get("reason") != before:
        agent.log("records_refused", node=agent.cfg.node, reason=ev.get("reason"),
                  detail=ev.get("detail"), hint=ev.get("hint"))
    return True


def refused_why(agent: Agent) -> str:
    """What the closing line says of refused records (empty when none were)."""
    dec = agent.refused
    if dec is None:
        return ""
    ev = dec.evidence if isinstance(dec.evidence, dict) else {}
    return (f"the processors refuse this node's records ({ev.get('reason')}): "
            f"{ev.get('hint')}")


async def answer_probes(agent: Agent, control: Decisions) -> None:
    """Run for the agent's life: answer every probe that arrives on the control channel, and
    keep what the processors say of this node's refused records."""
    while True:
        dec = await control.get()
        if dec is None:
            continue
        if is_refusal(dec):
            note_refused(agent, dec)
        else:
            answer_probe(agent, dec, "control")
