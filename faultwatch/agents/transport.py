"""Where the agent's records go and its decisions come from: Kafka, or an in-process pipeline."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable
from typing import TYPE_CHECKING, Protocol

from faultwatch import wire
from faultwatch.core.diagnosis import is_probe
from faultwatch.core.events import Decision

if TYPE_CHECKING:
    from faultwatch.agents.config import AgentConfig
    from faultwatch.metrics import AgentStats

Log = Callable[..., None]
GapNotice = Callable[[int, int, int, str], None]  # (records, lines, kept, reason) dropped
Clock = Callable[[], float]


class Decisions(Protocol):
    """The job's new decisions, deduplicated by id, in arrival order."""

    async def get(self, timeout: float | None = None) -> Decision | None: ...

    async def close(self) -> None: ...


class Transport(Protocol):
    """Records out, decisions in. The supervisor sees only this."""

    @property
    def decisions(self) -> Decisions | None:
        """The job's decisions; None when the agent does not act on them."""

    @property
    def control(self) -> Decisions | None:
        """The job's control requests (diagnosis probes, <prefix>control); None: none."""

    def start(self) -> None: ...

    async def ready(self, timeout_s: float) -> bool:
        """Wait (bounded) until a decision published from now on cannot be missed."""

    def submit(self, value: bytes, flags: int = 0, nlines: int = 0,
               key: bytes | None = None) -> object: ...

    def submit_lifecycle(self, value: bytes, key: bytes | None = None) -> object: ...

    def on_gap(self, notice: GapNotice) -> None: ...

    def stats(self) -> AgentStats: ...

    async def finish(self, timeout_s: float) -> None: ...


class KafkaTransport:
    """Cluster mode: the disk spool and Shipper out to <prefix>logs, the DecisionFollower in."""

    def __init__(self, cfg: AgentConfig, log: Log):
        from faultwatch.agents.decisions import (
            DecisionFollower,
            replay_state_file,
            run_id_to_match,
        )
        from faultwatch.agents.shipper import Shipper
        from faultwatch.agents.spool import Spool

        self.cfg, self._log = cfg, log
        self.spool = Spool(cfg.spool_path, cap_bytes=cfg.spool_cap_bytes)
        if self.spool.stats.replayed or self.spool.stats.corrupt:
            log("spool_replay", records=self.spool.pending, corrupt=self.spool.stats.corrupt,
                dir=cfg.spool_path)
        from faultwatch.trust.keys import NODE_KEY_FILE_ENV, load_signing_key
        from faultwatch.trust.nodesig import NodeSigner

        # the node key: read once here, never passed to the child (agent.child_env)
        key = load_signing_key(cfg.node_key_file, cfg.env, NODE_KEY_FILE_ENV)
        if key is not None:
            log("node_signing", node=cfg.node, key_id=key.key_id)
        self.shipper = Shipper(cfg.bootstrap, cfg.topic, wire.log_key(cfg.job, cfg.node),
                               self.spool, log, compression=cfg.compression,
                               signer=NodeSigner(key) if key is not None else None)
        self.decisions: DecisionFollower | None = None
        self.control: DecisionFollower | None = None
        if cfg.follow_decisions:
            from faultwatch.trust.replay import ReplayGuard, max_age_s

            cfg.spool_path.mkdir(parents=True, exist_ok=True)
            replay = ReplayGuard("decision", max_age_s(), replay_state_file(cfg), log)
            self.decisions = DecisionFollower(cfg.bootstrap, cfg.decisions_topic, cfg.job, log,
                                              run_id=run_id_to_match(cfg), replay=replay)
            # the probes come on their own topic (docs/decisions.md, "Control topic")
            self.control = DecisionFollower(cfg.bootstrap, cfg.control_topic, cfg.job, log,
                                            run_id=run_id_to_match(cfg),
                                            gate=self.decisions.gate)

    def start(self) -> None:
        self.shipper.start()
        if self.decisions is not None:  # before the first launch: no decision is missed
            self.decisions.start()
        if self.control is not None:
            self.control.start()

    async def ready(self, timeout_s: float) -> bool:
        if self.decisions is None:
            return True
        return await self.decisions.wait_ready(timeout_s)  # positioned before the child

    def submit(self, value: bytes, flags: int = 0, nlines: int = 0,
               key: bytes | None = None) -> object:
        return self.shipper.submit(value, flags, nlines, key)

    def submit_lifecycle(self, value: bytes, key: bytes | None = None) -> object:
        return self.shipper.submit_lifecycle(value, key)

    def on_gap(self, notice: GapNotice) -> None:
        self.shipper.on_gap(notice)

    def stats(self) -> AgentStats:
        s, sh = self.shipper.stats, self.shipper
        return {"lines_acked": s.lines_acked, "spool_depth": sh.spool_depth(),
                "spool_bytes": sh.spool_bytes(), "drops": s.drops,
                "ack_lag_s": round(sh.ack_lag_s, 3), "broker_up": sh.broker_up}

    async def finish(self, timeout_s: float) -> None:
        for follower in (self.decisions, self.control):
            if follower is not None:
                await follower.close()
        if not await self.shipper.drain(timeout_s):
            self._log("flush_timeout", unsent_records=self.shipper.spool_depth(),
                      timeout_s=timeout_s, spool=self.cfg.spool_path)
        await self.shipper.close()


class Pipeline(Protocol):
    """The processor's stages in-process (streams.local.LocalPipeline)."""

    def submit(self, key: bytes, value: bytes, now: float) -> list[Decision]: ...

    def tick(self, now: float) -> list[Decision]: ...


class LocalDecisions:
    """An in-memory decisions "topic" for one job: deduplicated by id, queued for get()."""

    def __init__(self, job: str, publish: Callable[[Decision], None]):
        self.job = job
        self._publish = publish
        self._seen: set[str] = set()
        self._queue: asyncio.Queue[Decision] = asyncio.Queue()

    def offer(self, decs: list[Decision]) -> None:
        for d in decs:
            if d.job == self.job and d.id not in self._seen:
                self._seen.add(d.id)
                self._publish(d)
                self._queue.put_nowait(d)

    async def get(self, timeout: float | None = None) -> Decision | None:
        try:
            return await asyncio.wait_for(self._queue.get(), timeout)
        except TimeoutError:
            return None

    async def close(self) -> None:
        return None


class LocalTransport:
    """Embedded mode: every record goes straight through an in-process pipeline.

    The pipeline is ticked every tick_s (its timers: settle, hang windows); decisions are
    published (printed, written) and queued for the supervisor. `on_tick` runs first on
    every tick (embedded mode re-reads changed rule files there)."""

    def __init__(self, pipeline: Pipeline, job: str, publish: Callable[[Decision], None],
                 clock: Clock, tick_s: float = 0.5,
                 on_tick: Callable[[], None] | None = None,
                 publish_control: Callable[[Decision], None] | None = None):
        self.pipeline = pipeline
        self.decisions = LocalDecisions(job, publish)
        # the probes: never published with the decisions (at most traced, --control-out)
        self.control = LocalDecisions(job, publish_control or (lambda _d: None))
        self._clock = clock
        self._tick_s = tick_s
        self._on_tick = on_tick
        self._ticker: asyncio.Task[None] | None = None
        self.lines = 0
        self.records = 0

    def start(self) -> None:
        self._ticker = asyncio.create_task(self._tick_forever(), name="faultwatch-ticks")

    async def ready(self, timeout_s: float) -> bool:
        return True

    async def _tick_forever(self) -> None:
        while True:
            await asyncio.sleep(self._tick_s)
            if self._on_tick is not None:
                self._on_tick()
            self._route(self.pipeline.tick(self._clock()))

    def _route(self, decs: list[Decision]) -> None:
        """Probes to the control channel, decisions to the decisions "topic"."""
        if decs:
            self.control.offer([d for d in decs if is_probe(d)])
            self.decisions.offer([d for d in decs if not is_probe(d)])

    def submit(self, value: bytes, flags: int = 0, nlines: int = 0,
               key: bytes | None = None) -> object:
        self.records += 1
        self.lines += nlines
        self._route(self.pipeline.submit(key or b"", value, self._clock()))
        return None

    def submit_lifecycle(self, value: bytes, key: bytes | None = None) -> object:
        return self.submit(value, key=key)

    def on_gap(self, notice: GapNotice) -> None:
        return None  # nothing is spooled: nothing is ever dropped

    def stats(self) -> AgentStats:
        return {"lines_acked": self.lines, "spool_depth": 0, "spool_bytes": 0, "drops": 0,
                "ack_lag_s": 0.0, "broker_up": True}

    async def finish(self, timeout_s: float) -> None:
        if self._ticker is not None:
            self._ticker.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._ticker
