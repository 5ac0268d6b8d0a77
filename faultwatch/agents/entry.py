"""Entry points of the node agent: run a command under it (cluster or embedded), flush a spool."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import sys
from collections.abc import Callable
from pathlib import Path

from faultwatch import settings, wire
from faultwatch.agents.agent import Agent
from faultwatch.agents.agent_log import AgentLog
from faultwatch.agents.config import AgentConfig
from faultwatch.agents.control import answer_probes
from faultwatch.agents.exitcodes import (
    STOP_SIGNALS,
    Story,
    Verdict,
    signal_name,
    write_verdict,
)
from faultwatch.agents.sdk_server import SdkServer
from faultwatch.agents.supervisor import supervise_job
from faultwatch.agents.transport import Transport
from faultwatch.core.events import Decision
from faultwatch.errors import ConfigError, FaultwatchError

Render = Callable[[Decision, bool], str]  # a decision -> a block of text (colour: bool)


async def run_agent(cfg: AgentConfig, transport: Transport | None = None,
                    component: str = "agent", render: Render | None = None) -> int:
    """Run cfg.cmd under the agent; returns the agent's exit code (agents/exitcodes.py: a
    verdict, never the child's own code), after writing the verdict file and its line.

    transport None: Kafka (`faultwatch agent`); embedded mode passes a LocalTransport."""

    if not cfg.cmd:
        raise ConfigError("cmd", "no command to run")
    agent = Agent(cfg, transport, component)
    agent.render = render
    try:
        v = await _run(agent)
    except FaultwatchError as e:  # faultwatch's own error: its code, and a verdict saying so
        v = Verdict("error", e.exit_code, why=str(e)[:500], job=cfg.job, node=cfg.node,
                    run_id=agent.run_id, attempt=agent.attempt)
        _report(cfg, v, component, agent.story)
        raise
    _report(cfg, v, component, agent.story)
    return v.exit_code


def _report(cfg: AgentConfig, v: Verdict, component: str, story: Story | None = None) -> None:
    """The verdict as an event and the run's one closing summary line on stderr (written
    directly: the tee of the child's stderr is closed by now), and in --verdict-out."""
    log = AgentLog(cfg.node, None, component)
    log("verdict", verdict=v.verdict, exit_code=v.exit_code,
        child_exit_code=v.child_exit_code, child_signal=signal_name(v.child_signal),
        decision=(v.decision or {}).get("id"), attempt=v.attempt)
    with contextlib.suppress(OSError):
        os.write(2, (v.sentence(component, story) + "\n").encode("utf-8", "replace"))
    if cfg.verdict_out is not None:
        try:
            write_verdict(cfg.verdict_out, v)
        except OSError as e:  # the verdict stands; say the file could not be written
            log("verdict_out_failed", path=cfg.verdict_out, error=str(e)[:300])


async def _run(agent: Agent) -> Verdict:
    cfg = agent.cfg
    loop = asyncio.get_running_loop()
    for s in STOP_SIGNALS:
        loop.add_signal_handler(s, agent.on_signal, s)
    # SIGUSR1/2 (Slurm's --signal=USR1@T, Lightning's auto-requeue): passed on to the child,
    # and never the agent's own death (128+SIGUSR1 is 138, "run me elsewhere").
    passed = (signal.SIGUSR1, signal.SIGUSR2)
    for s in passed:
        loop.add_signal_handler(s, agent.pass_signal, s)
    sigs = (*STOP_SIGNALS, *passed)
    agent.transport.start()
    address_file = _serve_metrics(agent)
    await agent.transport.ready(cfg.decisions_ready_timeout_s)
    sdk = await _start_sdk(agent) if cfg.sdk else None
    control = agent.transport.control
    probes = asyncio.create_task(answer_probes(agent, control), name="faultwatch-control") \
        if control is not None else None
    try:
        return await supervise_job(agent)
    finally:
        if probes is not None:
            probes.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await probes
        for s in sigs:
            loop.remove_signal_handler(s)
        if sdk is not None:
            await sdk.close()
        await agent.finish()
        if address_file is not None:
            from faultwatch.metrics import remove_address_file

            remove_address_file(address_file)


def _serve_metrics(agent: Agent) -> Path | None:
    """/metrics on --metrics-port (0: a free port), and where it listens in
    --metrics-address-file (returned, to remove at exit). A port that is taken or a file that
    cannot be written is logged and the training runs on without them: metrics never stop a
    launch."""
    cfg = agent.cfg
    if cfg.metrics_port is None:
        return None
    from faultwatch import metrics

    labels = {"job_name": cfg.job, "node": cfg.node}
    try:
        server = metrics.serve(cfg.metrics_port, metrics.agent_registry(
            agent.stats, lambda: agent.child is not None and agent.child.returncode is None,
            labels), addr=cfg.metrics_address)
    except ConfigError as e:
        agent.log("metrics_unavailable", port=cfg.metrics_port, address=cfg.metrics_address,
                  error=str(e))
        return None
    port = metrics.bound_port(server)
    target = metrics.scrape_target(cfg.metrics_address, port)
    path = None
    if cfg.metrics_address_file:
        path = metrics.address_file_path(cfg.metrics_address_file, job=cfg.job, node=cfg.node)
        try:
            metrics.write_address_file(path, target)
        except OSError as e:
            agent.log("metrics_address_file_failed", path=path, error=str(e)[:300])
            path = None
    agent.log("metrics_listening", address=target, address_file=path)
    return path


async def _start_sdk(agent: Agent) -> SdkServer | None:
    """Open the SDK socket; its path goes to the child as $FAULTWATCH_SDK_SOCKET."""
    server = SdkServer(lambda kind, data, ts: agent.note(kind, data, ts), agent.log)
    try:
        await server.start()
    except OSError as e:  # e.g. a socket path over 107 bytes: run without the SDK
        agent.log("sdk_unavailable", error=str(e))
        await server.close()
        return None
    agent.extra_env.update(server.env)
    agent.sdk = server
    return server


async def flush_spool(cfg: AgentConfig) -> int:
    """Deliver what an earlier agent left in cfg's spool; 0 when all of it was acked."""
    from faultwatch.agents.shipper import Shipper
    from faultwatch.agents.spool import Spool

    log = AgentLog(cfg.node)
    spool = Spool(cfg.spool_path, cap_bytes=cfg.spool_cap_bytes)
    log("spool_replay", records=spool.pending, corrupt=spool.stats.corrupt, dir=cfg.spool_path)
    shipper = Shipper(cfg.bootstrap, cfg.topic, wire.log_key(cfg.job, cfg.node), spool, log,
                      compression=cfg.compression)
    shipper.start()
    try:
        ok = await shipper.drain(cfg.exit_flush_timeout_s)
    finally:
        await shipper.close()
    if not ok:
        log("flush_timeout", unsent_records=spool.pending)
    return 0 if ok else 1


def main_sync(cfg: AgentConfig, flush_only: bool = False,
              transport: Transport | None = None, component: str = "agent",
              render: Render | None = None) -> int:
    """asyncio.run wrapper used by the CLI (`faultwatch agent`, and `faultwatch run`);
    `render` prints each decision the agent reads as a block on its stderr."""
    # aiokafka logs every retry on stderr (hundreds of lines a minute while the broker is
    # down): that is the child's stderr we tee. Our own events report each state change
    # (broker_down/up, decisions_unavailable/following), so silence it unless configured.
    if not logging.getLogger().handlers:
        logging.getLogger("aiokafka").setLevel(logging.CRITICAL)
    # The delivery thread holds the GIL while it batches and compresses: let the reading
    # thread take it back within a fraction of a millisecond (default 5 ms).
    sys.setswitchinterval(settings.SWITCH_INTERVAL_S.value())
    try:
        return asyncio.run(flush_spool(cfg) if flush_only
                           else run_agent(cfg, transport, component, render))
    except KeyboardInterrupt:
        return 130
    finally:
        sys.stdout.flush()
