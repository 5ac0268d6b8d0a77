"""Tail mode: ship existing log files (jobs not started through faultwatch), by polling.

Offsets persist in a state file (only past complete lines, so a restart re-reads at most a
partial line); a rename-and-recreate rotation drains the old file before the new one; a
truncation (copytruncate) restarts the file at offset 0. All files of one tail agent form a
single run (a stable run id per job/node, so sequence numbers continue across restarts)."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import os
import signal
import socket
import time
import uuid
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import faultwatch
from faultwatch import wire
from faultwatch.agents.batcher import LineBatcher
from faultwatch.agents.config import AgentConfig
from faultwatch.agents.reader import LineBlock, LineSplitter, Piece
from faultwatch.agents.shipper import Shipper
from faultwatch.agents.spool import Spool
from faultwatch.core.events import STDOUT, Heartbeat, RunStart

if TYPE_CHECKING:
    from faultwatch.metrics import AgentStats

READ_PER_POLL = 4 << 20
HEAD_BYTES = 64


@dataclasses.dataclass
class _File:
    path: str
    splitter: LineSplitter
    fd: int | None = None
    ino: int = -1
    dev: int = -1
    offset: int = 0  # bytes read from the open file
    committed: int = 0  # offset just past the last complete line: what the state keeps
    head: bytes = b""  # the file's first bytes: a changed head means it was rewritten


class Tailer:
    """Polls files, splits their new bytes into Lines and hands them to sink()."""

    def __init__(self, paths: list[str], state: dict[str, Any], cfg: AgentConfig,
                 sink: Any, log: Any, from_end: bool = False):
        self.cfg, self.sink, self.log = cfg, sink, log
        self.next_seq = int(state.get("next_seq", 0))
        self.last_output_ts: float | None = None
        known = state.get("files", {})
        self.files = [_File(p, LineSplitter(STDOUT, cfg.max_line_bytes,
                                            cfg.progress_interval_s)) for p in paths]
        for f in self.files:
            k = known.get(f.path)
            if k is not None:
                f.ino, f.dev, f.committed = int(k["ino"]), int(k["dev"]), int(k["offset"])
                f.head = bytes.fromhex(k.get("head", ""))
            elif from_end:
                with contextlib.suppress(OSError):
                    st = os.stat(f.path)
                    f.ino, f.dev, f.committed = st.st_ino, st.st_dev, st.st_size

    def state(self) -> dict[str, Any]:
        return {"next_seq": self.next_seq,
                "files": {f.path: {"ino": f.ino, "dev": f.dev, "offset": f.committed,
                                   "head": f.head.hex()}
                          for f in self.files if f.ino >= 0}}

    def _emit(self, pieces: Sequence[Piece]) -> None:
        """Hand pieces on, numbered in one sequence across all files."""
        if not pieces:
            return
        out: list[Piece] = []
        for p in pieces:
            out.append(p._replace(seq=self.next_seq))
            self.next_seq += p.nlines if type(p) is LineBlock else 1
        self.last_output_ts = out[-1].ts
        self.sink(out)

    def _open(self, f: _File, st: os.stat_result) -> None:
        f.fd = os.open(f.path, os.O_RDONLY)
        same = (st.st_ino, st.st_dev) == (f.ino, f.dev) and st.st_size >= f.committed \
            and os.pread(f.fd, len(f.head), 0) == f.head
        if not same:
            f.head = b""
        f.ino, f.dev = st.st_ino, st.st_dev
        f.offset = f.committed = f.committed if same else 0
        os.lseek(f.fd, f.offset, os.SEEK_SET)

    def _close(self, f: _File) -> None:
        self._emit(f.splitter.flush(time.time()))
        if f.fd is not None:
            os.close(f.fd)
        f.fd = None

    def _read(self, f: _File, budget: int = READ_PER_POLL) -> None:
        assert f.fd is not None
        while budget > 0:
            data = os.read(f.fd, min(1 << 20, budget))
            if not data:
                break
            budget -= len(data)
            nl = data.rfind(b"\n")
            if nl >= 0:
                f.committed = f.offset + nl + 1
            f.offset += len(data)
            if len(f.head) < HEAD_BYTES:
                f.head = os.pread(f.fd, HEAD_BYTES, 0)
            self._emit(f.splitter.feed_blocks(data, time.time()))
        self._emit(f.splitter.tick(time.time()))

    def poll(self) -> None:
        for f in self.files:
            try:
                st: os.stat_result | None = os.stat(f.path)
            except OSError:
                st = None
            if f.fd is not None:
                if st is None or (st.st_ino, st.st_dev) != (f.ino, f.dev):
                    self._read(f, 1 << 62)  # rotated (renamed): drain the old file first
                    self.log("tail_rotated", path=f.path)
                    self._close(f)
                    f.committed = 0
                elif st.st_size < f.offset or os.pread(f.fd, len(f.head), 0) != f.head:
                    self.log("tail_truncated", path=f.path, was=f.offset, now=st.st_size)
                    self._close(f)
                    f.committed = 0
                    f.ino = -1
            if f.fd is None and st is not None:
                try:
                    self._open(f, st)
                except OSError as e:
                    self.log("tail_open_failed", path=f.path, error=str(e))
                    continue
            if f.fd is not None:
                self._read(f)

    def close(self) -> None:
        for f in self.files:
            if f.fd is not None:
                self._close(f)


def _save_state(path: Path, state: dict[str, Any]) -> None:
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(state))
    os.replace(tmp, path)


async def run_tail(cfg: AgentConfig, paths: list[str], state_file: Path, poll_s: float,
                   from_end: bool) -> int:
    from faultwatch.agents.agent_log import AgentLog

    log = AgentLog(cfg.node)
    run_id = uuid.uuid5(uuid.NAMESPACE_URL, f"faultwatch-tail:{cfg.job}/{cfg.node}").hex
    state = json.loads(state_file.read_text()) if state_file.exists() else {}
    shipper = Shipper(cfg.bootstrap, cfg.topic, wire.log_key(cfg.job, cfg.node),
                      Spool(cfg.spool_path, cap_bytes=cfg.spool_cap_bytes), log)
    batcher = LineBatcher(lambda ps: wire.encode_line_chunks(cfg.job, cfg.attempt, cfg.node,
                                                             run_id, ps), shipper.submit,
                           linger_s=cfg.linger_ms / 1000)
    tailer = Tailer(paths, state, cfg, batcher.add, log, from_end)
    started = time.time()
    shipper.submit_lifecycle(wire.encode_run_start(RunStart(
        job=cfg.job, attempt=cfg.attempt, node=cfg.node, ts=started, run_id=run_id,
        nnodes=cfg.nnodes, host=socket.gethostname(), pid=os.getpid(),
        cmd=("tail", *paths), agent_version=faultwatch.__version__)))
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for s in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(s, stop.set)
    shipper.start()
    log("tail_start", files=len(paths), state=state_file, next_seq=tailer.next_seq)
    next_hb = 0.0
    try:
        while not stop.is_set():
            tailer.poll()
            batcher.flush()
            _save_state(state_file, tailer.state())  # lines are spooled: safe to commit
            if time.monotonic() >= next_hb:
                next_hb = time.monotonic() + cfg.heartbeat_s
                hb = Heartbeat(cfg.job, cfg.attempt, cfg.node, time.time(), True,
                               tailer.last_output_ts, started)
                stats: AgentStats = {
                    "lines_read": tailer.next_seq, "lines_acked": shipper.stats.lines_acked,
                    "spool_depth": shipper.spool_depth(), "broker_up": shipper.broker_up,
                    "mode": "tail"}
                shipper.submit_lifecycle(wire.encode_heartbeat(hb, run_id, stats))
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), poll_s)
        tailer.poll()
    finally:
        tailer.close()
        batcher.flush()
        _save_state(state_file, tailer.state())
        ok = await shipper.drain(cfg.exit_flush_timeout_s)
        await shipper.close()
    if not ok:
        log("flush_timeout", spool=cfg.spool_path)
    return 0


def tail_main(cfg: AgentConfig, paths: Sequence[str], state_file: Path | None, poll_s: float,
              from_end: bool) -> int:
    """`faultwatch agent tail --job J [--node N] PATH...` until SIGTERM/SIGINT; offsets in
    `state_file` (default <spool>/<job>/<node>/tail/state.json)."""
    cfg = dataclasses.replace(cfg, rank=None, spool_leaf="tail")  # spool: <job>/<node>/tail
    state = state_file if state_file is not None else cfg.spool_path / "state.json"
    state.parent.mkdir(parents=True, exist_ok=True)
    return asyncio.run(run_tail(cfg, [str(Path(p).absolute()) for p in paths], state, poll_s,
                                from_end))
