"""The node agent: runs the training command, ships its output and lifecycle to Kafka."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import re
import signal
import socket
import sys
import time
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import faultwatch
from faultwatch import wire
from faultwatch.agents.child import Child, ExitStatus
from faultwatch.agents.reader import LineSplitter, TeeWriter, pump
from faultwatch.agents.shipper import LineBatcher, Shipper
from faultwatch.agents.spool import Spool
from faultwatch.core.events import STDERR, STDOUT, Exit, Heartbeat, Line, RunStart
from faultwatch.errors import ChildError, ConfigError

DEFAULT_PREFIX = "faultwatch."
PIPE_DRAIN_AFTER_EXIT_S = 5.0  # grandchildren may hold the pipes open after the leader exits


def _env_int(env: Mapping[str, str], name: str) -> int | None:
    v = env.get(name)
    if v is None or v == "":
        return None
    try:
        return int(v)
    except ValueError:
        raise ConfigError(name, f"not an integer: {v!r}") from None


def rank_from_env(env: Mapping[str, str]) -> tuple[int | None, int | None]:
    """(rank, world_size) when run as torchrun's entrypoint (RANK, WORLD_SIZE set)."""
    return _env_int(env, "RANK"), _env_int(env, "WORLD_SIZE")


def default_spool_dir(env: Mapping[str, str]) -> Path:
    return Path(env.get("FAULTWATCH_SPOOL_DIR") or Path.home() / ".faultwatch" / "spool")


@dataclass(frozen=True, kw_only=True)
class AgentConfig:
    """Everything the agent needs; build it with from_env_defaults() to honour the env."""

    bootstrap: str
    job: str
    node: str
    cmd: tuple[str, ...]
    spool_dir: Path
    topic_prefix: str = DEFAULT_PREFIX
    attempt: int = 0
    heartbeat_s: float = 2.0
    rank: int | None = None
    world_size: int | None = None
    nnodes: int | None = None
    local_ranks: tuple[int, ...] = ()
    exit_flush_timeout_s: float = 10.0
    term_grace_s: float = 10.0
    max_line_bytes: int = 65536
    progress_interval_s: float = 1.0
    spool_cap_bytes: int = 256 << 20
    compression: str | None = None  # None: zstd if available, else gzip
    env: Mapping[str, str] | None = field(default=None, repr=False)  # child env (None: ours)

    @classmethod
    def from_env_defaults(cls, env: Mapping[str, str] | None = None, **kw: Any) -> AgentConfig:
        """Fill bootstrap, node, prefix, spool dir and rank fields from env where not given."""
        e = os.environ if env is None else env
        if kw.get("bootstrap") is None:
            kw["bootstrap"] = e.get("FAULTWATCH_BOOTSTRAP") or ""
        if not kw["bootstrap"]:
            raise ConfigError("bootstrap", "no --bootstrap and FAULTWATCH_BOOTSTRAP is unset")
        if kw.get("node") is None:
            kw["node"] = socket.gethostname()
        if kw.get("topic_prefix") is None:
            kw["topic_prefix"] = e.get("FAULTWATCH_TOPIC_PREFIX", DEFAULT_PREFIX)
        if kw.get("spool_dir") is None:
            kw["spool_dir"] = default_spool_dir(e)
        rank, world = rank_from_env(e)
        if kw.get("rank") is None:
            kw["rank"] = rank
        if kw.get("world_size") is None:
            kw["world_size"] = world
        local = _env_int(e, "LOCAL_RANK")
        if not kw.get("local_ranks") and local is not None:
            kw["local_ranks"] = (local,)
        lws = _env_int(e, "LOCAL_WORLD_SIZE")
        if kw.get("nnodes") is None and world and lws:
            kw["nnodes"] = max(1, world // lws)
        kw["spool_dir"] = Path(kw["spool_dir"])
        kw["cmd"] = tuple(kw.get("cmd") or ())
        return cls(**{k: v for k, v in kw.items() if v is not None or k in _NULLABLE})

    @property
    def topic(self) -> str:
        return f"{self.topic_prefix}logs"

    @property
    def spool_path(self) -> Path:
        """One spool per job, node and (in rank mode) rank: concurrent agents never share."""
        def safe(s: str) -> str:
            return re.sub(r"[^A-Za-z0-9._-]", "_", s) or "_"
        leaf = f"rank{self.rank}" if self.rank is not None else "agent"
        return self.spool_dir / safe(self.job) / safe(self.node) / leaf


_NULLABLE = {"rank", "world_size", "nnodes", "compression", "env"}


class AgentLog:
    """The agent's own messages: one `faultwatch-agent event=... k=v` line each, on stderr."""

    def __init__(self, node: str, tee: TeeWriter | None = None):
        self.node = node
        self.tee = tee

    def __call__(self, event: str, **kv: Any) -> None:
        parts = [f"faultwatch-agent event={event} node={self.node}"]
        for k, v in kv.items():
            s = str(v)
            parts.append(f"{k}={s!r}" if (" " in s or not s) else f"{k}={s}")
        line = (" ".join(parts) + "\n").encode()
        if self.tee is not None:
            self.tee.write(line)
        else:
            with contextlib.suppress(OSError):
                os.write(2, line)


class _Agent:
    """One run: the child, its two pumps, the batcher, heartbeats and the shipper."""

    def __init__(self, cfg: AgentConfig):
        self.cfg = cfg
        self.run_id = uuid.uuid4().hex
        self.tee_out = TeeWriter(1)
        self.tee_err = TeeWriter(2)
        self.log = AgentLog(cfg.node, self.tee_err)
        self.spool = Spool(cfg.spool_path, cap_bytes=cfg.spool_cap_bytes)
        if self.spool.stats.replayed or self.spool.stats.corrupt:
            self.log("spool_replay", records=self.spool.pending,
                     corrupt=self.spool.stats.corrupt, dir=cfg.spool_path)
        self.shipper = Shipper(cfg.bootstrap, cfg.topic, wire.log_key(cfg.job, cfg.node),
                               self.spool, self.log, compression=cfg.compression)
        self.shipper.on_gap(self._gap)
        self.batcher = LineBatcher(self._encode_lines, self.shipper.submit)
        self.split = {s: LineSplitter(s, cfg.max_line_bytes, cfg.progress_interval_s)
                      for s in (STDOUT, STDERR)}
        self.child: Child | None = None
        self.started_ts: float | None = None
        self.lines_read = 0
        self.signals: list[int] = []
        self._kill_timer: asyncio.TimerHandle | None = None

    def _encode_lines(self, lines: list[Line]) -> bytes:
        c = self.cfg
        return wire.encode_lines(c.job, c.attempt, c.node, self.run_id, lines)

    def _gap(self, records: int, lines: int, kept: int) -> None:
        c = self.cfg
        self.shipper.submit_lifecycle(wire.encode_notice(
            c.job, c.attempt, c.node, time.time(), "gap",
            {"run_id": self.run_id, "records": records, "lines": lines, "kept_records": kept,
             "reason": "spool_cap"}))

    def sink(self, lines: list[Line]) -> None:
        self.lines_read += len(lines)
        self.batcher.add(lines)

    def last_output_ts(self) -> float | None:
        ts = [t for t in (sp.last_activity_ts for sp in self.split.values()) if t is not None]
        return max(ts) if ts else None

    def stats(self) -> dict[str, Any]:
        s = self.shipper.stats
        return {"lines_read": self.lines_read, "lines_acked": s.lines_acked,
                "spool_depth": self.spool.pending, "spool_bytes": self.spool.size_bytes,
                "drops": s.drops, "ack_lag_s": round(self.shipper.ack_lag_s, 3),
                "broker_up": self.shipper.broker_up,
                "tee_dropped_bytes": self.tee_out.dropped_bytes + self.tee_err.dropped_bytes}

    def heartbeat(self) -> None:
        c = self.cfg
        alive = self.child is not None and self.child.returncode is None
        hb = Heartbeat(c.job, c.attempt, c.node, time.time(), alive, self.last_output_ts(),
                       self.started_ts)
        self.shipper.submit_lifecycle(wire.encode_heartbeat(hb, self.run_id, self.stats()))

    async def heartbeats(self) -> None:
        while True:
            await asyncio.sleep(self.cfg.heartbeat_s)
            self.heartbeat()

    def on_signal(self, sig: int) -> None:
        self.signals.append(sig)
        self.log("signal", sig=signal.Signals(sig).name, forwarded=self.child is not None)
        if self.child is None or self.child.returncode is not None:
            return
        self.child.signal_group(sig)
        if self._kill_timer is None:
            self._kill_timer = asyncio.get_running_loop().call_later(
                self.cfg.term_grace_s, self._escalate)

    def _escalate(self) -> None:
        if self.child is not None and self.child.returncode is None:
            self.log("escalate", sig="SIGKILL", grace_s=self.cfg.term_grace_s)
            self.child.signal_group(signal.SIGKILL)

    def run_start(self, pid: int) -> None:
        c = self.cfg
        ev = RunStart(job=c.job, attempt=c.attempt, node=c.node, ts=time.time(),
                      run_id=self.run_id, world_size=c.world_size, nnodes=c.nnodes,
                      rank=c.rank, local_ranks=c.local_ranks, host=socket.gethostname(),
                      pid=pid, cmd=c.cmd, agent_version=faultwatch.__version__)
        self.shipper.submit_lifecycle(wire.encode_run_start(ev))

    def exit_event(self, st: ExitStatus) -> None:
        c = self.cfg
        ev = Exit(c.job, c.attempt, c.node, time.time(), st.exit_code, st.signal)
        self.shipper.submit_lifecycle(wire.encode_exit(ev, self.run_id))

    async def supervise(self) -> ExitStatus:
        c = self.cfg
        self.started_ts = time.time()
        try:
            self.child = await Child.spawn(c.cmd, c.env)
        except ChildError as e:
            self.log("spawn_failed", error=str(e))
            self.run_start(0)
            self.shipper.submit_lifecycle(wire.encode_notice(
                c.job, c.attempt, c.node, time.time(), "spawn_failed",
                {"run_id": self.run_id, "error": str(e)}))
            st = ExitStatus(127, None)
            self.exit_event(st)
            return st
        child = self.child
        self.run_start(child.pid)
        if self.signals:  # a signal arrived while spawning
            self.on_signal(self.signals[-1])
        pumps = [asyncio.create_task(pump(child.stdout, self.split[STDOUT], None, self.sink,
                                          tee=self.tee_out)),
                 asyncio.create_task(pump(child.stderr, self.split[STDERR], None, self.sink,
                                          tee=self.tee_err))]
        hb = asyncio.create_task(self.heartbeats())
        try:
            st = await child.wait()
            _, pending = await asyncio.wait(pumps, timeout=PIPE_DRAIN_AFTER_EXIT_S)
            if pending:
                killed = await child.kill_leftovers(0.0, term_first=False)
                self.log("pipes_held_open", leftovers_killed=killed)
                _, pending = await asyncio.wait(pumps, timeout=2.0)
                for t in pending:
                    t.cancel()
            elif child.group_alive():
                await child.kill_leftovers(min(2.0, c.term_grace_s))
        finally:
            hb.cancel()
            if self._kill_timer is not None:
                self._kill_timer.cancel()
        self.batcher.flush()
        self.heartbeat()
        self.exit_event(st)
        return st

    async def finish(self) -> None:
        c = self.cfg
        if not await self.shipper.drain(c.exit_flush_timeout_s):
            self.log("flush_timeout", unsent_records=self.spool.pending,
                     timeout_s=c.exit_flush_timeout_s, spool=c.spool_path)
        await self.spool.sync()
        await self.shipper.close()
        await self.tee_out.aclose(2.0)
        await self.tee_err.aclose(2.0)


async def run_agent(cfg: AgentConfig) -> int:
    """Run cfg.cmd under the agent; returns its exit code (128+N when killed by signal N)."""
    if not cfg.cmd:
        raise ConfigError("cmd", "no command to run")
    agent = _Agent(cfg)
    loop = asyncio.get_running_loop()
    sigs = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
    for s in sigs:
        loop.add_signal_handler(s, agent.on_signal, s)
    agent.shipper.start()
    sync = asyncio.create_task(agent.spool.sync_forever())
    try:
        st = await agent.supervise()
        if st.exit_code != 0:
            agent.log("child_exit", exit_code=st.exit_code, signal=st.signal)
    finally:
        for s in sigs:
            loop.remove_signal_handler(s)
        sync.cancel()
        await agent.finish()
    return st.exit_code


async def flush_spool(cfg: AgentConfig) -> int:
    """Deliver what an earlier agent left in cfg's spool; 0 when all of it was acked."""
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


def main_sync(cfg: AgentConfig, flush_only: bool = False) -> int:
    """asyncio.run wrapper used by the CLI."""
    # aiokafka warns on stderr (e.g. "Topic ... not found" before auto-creation): that is the
    # child's stderr we tee, so keep only its errors unless logging was configured.
    if not logging.getLogger().handlers:
        logging.getLogger("aiokafka").setLevel(logging.ERROR)
    try:
        return asyncio.run(flush_spool(cfg) if flush_only else run_agent(cfg))
    except KeyboardInterrupt:
        return 130
    finally:
        sys.stdout.flush()
