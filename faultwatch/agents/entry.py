"""Entry points of the node agent: run a command under it (cluster or embedded), flush a spool."""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import sys

from faultwatch import wire
from faultwatch.agents.agent import Agent
from faultwatch.agents.agent_log import AgentLog
from faultwatch.agents.config import AgentConfig
from faultwatch.agents.sdk_server import SdkServer
from faultwatch.agents.supervisor import supervise_job
from faultwatch.agents.transport import Transport
from faultwatch.errors import ConfigError


async def run_agent(cfg: AgentConfig, transport: Transport | None = None,
                    component: str = "agent") -> int:
    """Run cfg.cmd under the agent; returns its exit code (128+N when killed by signal N).

    transport None: Kafka (`faultwatch agent`); embedded mode passes a LocalTransport."""

    if not cfg.cmd:
        raise ConfigError("cmd", "no command to run")
    agent = Agent(cfg, transport, component)
    loop = asyncio.get_running_loop()
    sigs = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
    for s in sigs:
        loop.add_signal_handler(s, agent.on_signal, s)
    agent.transport.start()
    if cfg.metrics_port:
        from faultwatch import metrics

        metrics.serve(cfg.metrics_port, metrics.agent_registry(
            agent.stats, lambda: agent.child is not None and agent.child.returncode is None,
            {"job_name": cfg.job, "node": cfg.node}), addr=cfg.metrics_address)
    await agent.transport.ready(cfg.decisions_ready_timeout_s)
    sdk = await _start_sdk(agent) if cfg.sdk else None
    try:
        return await supervise_job(agent)
    finally:
        for s in sigs:
            loop.remove_signal_handler(s)
        if sdk is not None:
            await sdk.close()
        await agent.finish()


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
              transport: Transport | None = None, component: str = "agent") -> int:
    """asyncio.run wrapper used by the CLI (`faultwatch agent`, and `faultwatch run`)."""
    # aiokafka logs every retry on stderr (hundreds of lines a minute while the broker is
    # down): that is the child's stderr we tee. Our own events report each state change
    # (broker_down/up, decisions_unavailable/following), so silence it unless configured.
    if not logging.getLogger().handlers:
        logging.getLogger("aiokafka").setLevel(logging.CRITICAL)
    # The delivery thread holds the GIL while it batches and compresses: let the reading
    # thread take it back within a fraction of a millisecond (default 5 ms).
    sys.setswitchinterval(float(os.environ.get("FAULTWATCH_SWITCH_INTERVAL_S", "0.0005")))
    try:
        return asyncio.run(flush_spool(cfg) if flush_only
                           else run_agent(cfg, transport, component))
    except KeyboardInterrupt:
        return 130
    finally:
        sys.stdout.flush()
