"""The node agent: runs the training command, ships its output and lifecycle to Kafka."""

from __future__ import annotations

import asyncio
import os
import shutil
import signal
import socket
import tempfile
import time
import uuid
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

import faultwatch
from faultwatch import settings, wire
from faultwatch.agents import rendezvous, torchrun_env
from faultwatch.agents.agent_log import AgentLog  # noqa: F401 - re-exported
from faultwatch.agents.batcher import LineBatcher
from faultwatch.agents.child import Child, ExitStatus
from faultwatch.agents.config import (  # noqa: F401 - re-exported for callers and tests
    DEFAULT_PREFIX,
    AgentConfig,
    default_spool_dir,
    rank_from_env,
)
from faultwatch.agents.dumps import Diagnoser
from faultwatch.agents.exitcodes import Story
from faultwatch.agents.reader import (
    LineBlock,
    LineSplitter,
    Piece,
    RankLineSplitter,
    TeeWriter,
    pump,
)
from faultwatch.agents.roles import check_spare, role_of
from faultwatch.agents.sdk_server import SdkServer
from faultwatch.agents.transport import KafkaTransport, Transport
from faultwatch.core.events import STDERR, STDOUT, Decision, Exit, Heartbeat, RunStart
from faultwatch.errors import ChildError

if TYPE_CHECKING:
    from faultwatch.metrics import AgentStats

PIPE_DRAIN_AFTER_EXIT_S = 5.0  # grandchildren may hold the pipes open after the leader exits
PIPE_QUIET_S = 0.3  # ... reading stops earlier once they were quiet this long
PIPE_POLL_S = 0.1
LEFTOVER_GRACE_S = 2.0  # group members left after the leader: SIGTERM, then SIGKILL
# After a gap (lines dropped: full spool disk, spool cap) the printed lines do not reach the
# processor, so they prove nothing: heartbeats keep the quiet cadence for this long after
# the last drop report (the shipper reports drops at most every 5 s, WRITE_DROP_REPORT_S).
LINES_LOST_HOLD_S = 10.0


def heartbeat_due(printed: bool, since_sent_s: float, flowing_s: float,
                  since_lines_lost_s: float = float("inf")) -> bool:
    """Whether the heartbeat of this interval is sent. A heartbeat proves silence (hang
    detection, in event time), so every interval in which the child printed nothing sends
    one; while it prints, its shipped lines already show the node alive (node lost) and a
    heartbeat goes out only every `flowing_s` (progress stall and exit hang, which need
    output to flow, are evaluated on it). Printed lines that were dropped
    (`since_lines_lost_s` < LINES_LOST_HOLD_S) do not count: they never reach the processor."""
    if since_lines_lost_s < LINES_LOST_HOLD_S:
        return True
    return not printed or since_sent_s >= flowing_s


def _is_terminal(fd: int) -> bool:
    """Whether fd is a terminal a person reads (colour allowed: not with $NO_COLOR)."""
    try:
        return os.isatty(fd) and not os.environ.get("NO_COLOR")
    except OSError:
        return False


# What the child never inherits: where the node and signing keys are, legacy HMAC secrets
# (the variables settings.py declares secret).
SECRET_ENV = settings.CHILD_STRIPPED


class Agent:
    """The supervisor of one command: the transport lives as long as it; attempts come and go.

    The same class runs `faultwatch agent` (KafkaTransport) and `faultwatch run` (a
    LocalTransport over the in-process pipeline). The run id is the job run's, the same
    for every attempt; each attempt (one launch of the child) has its own line splitters
    (sequence numbers), batcher, heartbeats and exit. restart() begins the next attempt."""

    def __init__(self, cfg: AgentConfig, transport: Transport | None = None,
                 component: str = "agent"):
        self.cfg = cfg
        self.attempt = cfg.attempt
        self.tee_out = TeeWriter(1)
        self.tee_err = TeeWriter(2)
        self.log = AgentLog(cfg.node, self.tee_err, component)
        self.transport: Transport = transport or KafkaTransport(cfg, self.log)
        self.transport.on_gap(self._gap)
        self.stopping = asyncio.Event()  # the agent was signalled: no more runs
        self.signals: list[int] = []
        self.extra_env: dict[str, str] = {}
        self.diagnoser: Diagnoser | None = None  # answers `diagnose` decisions (dumps.py)
        if cfg.diagnose:
            self.diagnoser = Diagnoser(self.note, self.log, os.environ if cfg.env is None
                                       else cfg.env)
            self.extra_env.update(self.diagnoser.env)
        self.torchrun_dir: Path | None = None  # torchrun's tee files (agents/torchrun_env.py)
        self.rank_prefixed = False  # lines come as `[rankN]:...`: rejoin each rank's lines
        if cfg.rank is None:  # one agent per node: torchrun's workers' lines get their rank
            self._torchrun_ranks(os.environ if cfg.env is None else cfg.env)
        self.sdk: SdkServer | None = None
        self.probes_seen: set[str] = set()  # diagnosis requests answered (agents/control.py)
        self.refused: Decision | None = None  # the processors refuse this node's records
        self.born_ts = time.time()
        self.story = Story(self.born_ts)  # for the closing summary (exitcodes.Story)
        # a decision as a block for a person (the CLI passes readers.render.render_decision)
        self.render: Callable[[Decision, bool], str] | None = None
        self.tee_err_is_terminal = _is_terminal(2)
        self.lines_lost_mono = -float("inf")  # when the last gap (dropped lines) was reported
        # The job run's identity: stable across this agent's attempts (restarts do not make
        # a new run). Generated per agent process until a flag or scheduler names the run.
        self.run_id = cfg.run_id or f"g-{uuid.uuid4().hex}"  # agents/identity.py
        self.run_source = cfg.run_source or "generated"
        self._warn_unshared_run_id(os.environ if cfg.env is None else cfg.env)
        # active, or a hot spare waiting to replace a bad node (agents/roles.py, spare.py)
        self.role = role_of(cfg.spare, cfg.spares, os.environ if cfg.env is None else cfg.env,
                            cfg.node_index, cfg.nodes_total)
        if self.role.spare:
            check_spare(cfg, self.run_source)
        # after a swap: the nodes of the next attempt wait for each other (prelaunch)
        self.sync_nodes = 0
        self._new_run()

    def _warn_unshared_run_id(self, env: Mapping[str, str]) -> None:
        """A launch over several nodes with a generated run id: each node's agent has its
        own, so the job stage sees one run per node (docs/agent.md, "Run identity")."""
        launch = rendezvous.launch_of(self.cfg.cmd, env)
        if self.run_source == "generated" and rendezvous.spans_nodes(launch, self.cfg.nnodes,
                                                                      env):
            self.log("run_id_not_shared", run_id=self.run_id, nnodes=launch.nnodes or
                     self.cfg.nnodes, endpoint=launch.endpoint,
                     hint="this launch spans nodes but names no shared run: give every "
                          f"node's agent the same --run-id (or {settings.RUN_ID.name}), "
                          "torchrun "
                          "--rdzv-id, or a rendezvous endpoint other nodes reach")

    def _torchrun_ranks(self, env: Mapping[str, str]) -> None:
        tmp = Path(tempfile.mkdtemp(prefix="faultwatch-torchrun-"))
        added, why = torchrun_env.rank_env(self.cfg.cmd, env, tmp)
        if "PET_LOG_DIR" in added:
            self.torchrun_dir = tmp
        else:
            shutil.rmtree(tmp, ignore_errors=True)
        self.extra_env.update(added)
        template = added.get(torchrun_env.TEMPLATE_ENV) or env.get(torchrun_env.TEMPLATE_ENV)
        self.rank_prefixed = template == torchrun_env.TEMPLATE
        self.log("torchrun_ranks", set=",".join(sorted(added)) or None, why=why)

    def _new_run(self) -> None:
        c = self.cfg
        self.batcher = LineBatcher(self._encode_lines, self.transport.submit,
                                   linger_s=c.linger_ms / 1000)
        splitter = RankLineSplitter if self.rank_prefixed else LineSplitter
        self.split = {s: splitter(s, c.max_line_bytes, c.progress_interval_s)
                      for s in (STDOUT, STDERR)}
        self.child: Child | None = None
        self.started_ts: float | None = None
        self.lines_read = 0
        self._kill_timer: asyncio.TimerHandle | None = None

    def log_plain(self, text: str) -> None:
        """A sentence for the operator on the agent's stderr (beside the event= lines)."""
        self.tee_err.write((text.rstrip("\n") + "\n").encode())

    def restart(self) -> None:
        """Begin the next attempt (after a restart decision)."""
        self.attempt += 1
        self.story.restarts += 1
        self._new_run()

    # ---- records -------------------------------------------------------------------------
    def _encode_lines(self, pieces: list[Piece]) -> bytes:
        c = self.cfg
        return wire.encode_line_chunks(c.job, self.attempt, c.node, self.run_id, pieces,
                                       rank=c.rank)

    def note(self, kind: str, data: dict[str, Any], ts: float | None = None) -> None:
        """Ship a `note` record (progress, stage, notify, bootcheck, hello, gap, ...)."""
        c = self.cfg
        self.transport.submit_lifecycle(wire.encode_notice(
            c.job, self.attempt, c.node, time.time() if ts is None else ts, kind, data,
            run_id=self.run_id))

    def _gap(self, records: int, lines: int, kept: int, reason: str = "spool_cap") -> None:
        self.lines_lost_mono = time.monotonic()
        self.note("gap", {"run_id": self.run_id, "records": records, "dropped_lines": lines,
                          "lines": lines, "kept_records": kept, "reason": reason})

    def sink(self, pieces: list[Piece]) -> None:
        self.lines_read += sum(p.nlines if type(p) is LineBlock else 1 for p in pieces)
        self.batcher.add(pieces)

    def last_output_ts(self) -> float | None:
        ts = [t for t in (sp.last_activity_ts for sp in self.split.values()) if t is not None]
        return max(ts) if ts else None

    def stats(self) -> AgentStats:
        return {"lines_read": self.lines_read, **self.transport.stats(),
                "tee_dropped_bytes": self.tee_out.dropped_bytes + self.tee_err.dropped_bytes}

    def heartbeat(self) -> None:
        c = self.cfg
        alive = self.child is not None and self.child.returncode is None
        hb = Heartbeat(c.job, self.attempt, c.node, time.time(), alive, self.last_output_ts(),
                       self.started_ts)
        self.transport.submit_lifecycle(wire.encode_heartbeat(hb, self.run_id, self.stats()))

    async def heartbeats(self) -> None:
        sent_at = time.monotonic()
        seen = self.last_output_ts()
        while True:
            await asyncio.sleep(self.cfg.heartbeat_s)
            out = self.last_output_ts()
            now = time.monotonic()
            if heartbeat_due(out != seen, now - sent_at, self.cfg.heartbeat_flowing_s,
                             now - self.lines_lost_mono):
                self.heartbeat()
                sent_at = time.monotonic()
            seen = out

    def run_start(self, pid: int) -> None:
        c = self.cfg
        ev = RunStart(job=c.job, attempt=self.attempt, node=c.node, ts=time.time(),
                      run_id=self.run_id, run_source=self.run_source,
                      world_size=c.world_size, nnodes=c.nnodes,
                      rank=c.rank, local_ranks=c.local_ranks, host=socket.gethostname(),
                      pid=pid, cmd=c.cmd, agent_version=faultwatch.__version__,
                      scheduler=c.scheduler)
        self.transport.submit_lifecycle(wire.encode_run_start(ev))

    def exit_event(self, st: ExitStatus) -> None:
        c = self.cfg
        # signalled (SIGTERM/SIGINT/SIGHUP to the agent): an operator's stop, not a failure
        ev = Exit(c.job, self.attempt, c.node, time.time(), st.exit_code, st.signal,
                  stopped=bool(self.signals))
        self.transport.submit_lifecycle(wire.encode_exit(ev, self.run_id))

    # ---- signals -------------------------------------------------------------------------
    def on_signal(self, sig: int) -> None:
        self.signals.append(sig)
        self.stopping.set()
        self.log("signal", sig=signal.Signals(sig).name, forwarded=self.child is not None)
        if self.child is None or self.child.returncode is not None:
            return
        self.child.signal_group(sig)
        if self._kill_timer is None:
            self._kill_timer = asyncio.get_running_loop().call_later(
                self.cfg.term_grace_s, self._escalate)

    def pass_signal(self, sig: int) -> None:
        """SIGUSR1/SIGUSR2: hand it to the child's group (Slurm's --signal warnings, a
        framework's requeue hook); the agent itself neither stops nor dies by it."""
        running = self.child is not None and self.child.returncode is None
        self.log("signal", sig=signal.Signals(sig).name, forwarded=running, stopping=False)
        if running and self.child is not None:
            self.child.signal_group(sig)

    def _escalate(self) -> None:
        if self.child is not None and self.child.returncode is None:
            self.log("escalate", sig="SIGKILL", grace_s=self.cfg.term_grace_s)
            self.child.kill_tree()

    async def stop_child(self) -> None:
        """Stop the running child's group: SIGTERM, SIGKILL after the grace period."""
        if self.child is not None and self.child.returncode is None:
            await self.child.stop(self.cfg.term_grace_s)

    # ---- one run -------------------------------------------------------------------------
    def child_env(self) -> dict[str, str]:
        c = self.cfg
        # key files and secrets stay with the agent
        env = settings.child_env(os.environ if c.env is None else c.env, JOB=c.job,
                                 NODE_NAME=c.node, ATTEMPT=str(self.attempt))
        env.update(self.extra_env)
        return env

    async def supervise(self) -> ExitStatus:
        """Run the child once to its end (pipes drained); ship its start, lines and exit."""
        c = self.cfg
        self.started_ts = time.time()
        try:
            self.child = await Child.spawn(c.cmd, self.child_env())
        except ChildError as e:
            self.log("spawn_failed", error=str(e))
            self.run_start(0)
            self.note("spawn_failed", {"run_id": self.run_id, "error": str(e)})
            st = ExitStatus(127, None)
            self.exit_event(st)
            return st
        child = self.child
        self.run_start(child.pid)
        self.log("child_started", attempt=self.attempt, pid=child.pid)
        if self.signals:  # a signal arrived while spawning
            self.on_signal(self.signals[-1])
        pumps = [asyncio.create_task(pump(child.stdout, self.split[STDOUT], None, self.sink,
                                          tee=self.tee_out, blocks=True, pipe=child.pipe(1))),
                 asyncio.create_task(pump(child.stderr, self.split[STDERR], None, self.sink,
                                          tee=self.tee_err, blocks=True, pipe=child.pipe(2)))]
        hb = asyncio.create_task(self.heartbeats())
        try:
            st = await child.wait()
            self.heartbeat()  # alive=False at once: the exit is not held up by the pipes
            await self._drain_after_exit(child, pumps)
        finally:
            hb.cancel()
            if self._kill_timer is not None:
                self._kill_timer.cancel()
        if self.sdk is not None:
            await self.sdk.settle()
        self.batcher.flush()
        self.heartbeat()
        self.exit_event(st)
        return st

    async def _drain_after_exit(self, child: Child, pumps: list[asyncio.Task[None]]) -> None:
        """The leader exited: read what is left in the pipes, for a bounded time.

        The pipes normally close with the leader. Processes it left behind may hold them
        open: reading stops once the pipes were quiet for PIPE_QUIET_S (or after
        PIPE_DRAIN_AFTER_EXIT_S of output), then the child's group members are stopped
        (SIGTERM, SIGKILL after a short grace) and our pipe ends are closed. Processes that
        left the group (setsid, daemons) are not killed: their later output is not read."""
        loop = asyncio.get_running_loop()
        exit_ts = time.time()
        deadline = loop.time() + PIPE_DRAIN_AFTER_EXIT_S
        while True:
            _, pending = await asyncio.wait(pumps, timeout=PIPE_POLL_S)
            if not pending:
                break
            last = max(exit_ts, self.last_output_ts() or 0.0)
            if loop.time() >= deadline or time.time() - last >= PIPE_QUIET_S:
                break
        held_open = bool(pending)
        killed = False
        if child.group_alive():
            killed = await child.kill_leftovers(min(LEFTOVER_GRACE_S, self.cfg.term_grace_s))
            if pending:
                _, pending = await asyncio.wait(pumps, timeout=PIPE_POLL_S * 5)
        if pending:  # held by processes outside the group: stop reading
            child.close_pipes()
            await asyncio.wait(pumps, timeout=1.0)
        if held_open:
            self.log("pipes_held_open", leftovers_killed=killed, outside_group=bool(pending))
        for t in pumps:
            t.cancel()

    async def finish(self) -> None:
        if self.diagnoser is not None:
            self.diagnoser.close()
        if self.torchrun_dir is not None:
            shutil.rmtree(self.torchrun_dir, ignore_errors=True)
        await self.transport.finish(self.cfg.exit_flush_timeout_s)
        await self.tee_out.aclose(2.0)
        await self.tee_err.aclose(2.0)


_Agent = Agent  # the earlier name
