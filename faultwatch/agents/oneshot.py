"""Shipping a few notes without a child (e.g. `agent bootcheck` on demand): spool, send, exit."""

from __future__ import annotations

import asyncio
import time
from typing import Any

from faultwatch import wire
from faultwatch.agents.config import AgentConfig
from faultwatch.agents.shipper import Shipper
from faultwatch.agents.spool import Spool


def ship_notes(cfg: AgentConfig, notes: list[tuple[str, dict[str, Any]]]) -> bool:
    """Spool and deliver notes (kind, data) for cfg's job/node; True when all were acked."""
    from faultwatch.agents.agent_log import AgentLog

    async def main() -> bool:
        log = AgentLog(cfg.node)
        shipper = Shipper(cfg.bootstrap, cfg.topic, wire.log_key(cfg.job, cfg.node),
                          Spool(cfg.spool_path, cap_bytes=cfg.spool_cap_bytes), log,
                          compression=cfg.compression)
        for kind, data in notes:
            shipper.submit_lifecycle(wire.encode_notice(cfg.job, cfg.attempt, cfg.node,
                                                        time.time(), kind, data))
        shipper.start()
        try:
            return await shipper.drain(cfg.exit_flush_timeout_s)
        finally:
            await shipper.close()

    return asyncio.run(main())
