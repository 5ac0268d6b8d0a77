"""The agent's end of the training SDK: a Unix socket whose JSON-line messages become notes."""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import orjson

from faultwatch.sdk import MAX_MESSAGE, SOCKET_ENV

Note = Callable[[str, dict[str, Any], float], None]  # note(kind, data, ts)
Log = Callable[..., None]
KINDS = ("progress", "stage", "notify", "retryable_errors")
PROGRESS_EVERY_S = 1.0  # per rank: the latest progress is forwarded at most this often
_MAX_CONNECTIONS = 4096


def _clean(kind: str, rank: int | None, d: dict[str, Any]) -> dict[str, Any] | None:
    """The note data for an SDK message (the contract's fields), or None if malformed."""
    if kind == "progress":
        metrics = d.get("metrics")
        out: dict[str, Any] = {"rank": rank, "step": int(d["step"]),
                               "metrics": metrics if isinstance(metrics, dict) else {}}
        if d.get("step_time_s") is not None:
            out["step_time_s"] = float(d["step_time_s"])
        return out
    if kind == "stage":
        w = d.get("hang_window_s")
        out = {"rank": rank, "stage": str(d["stage"]), "opens": bool(d["opens"]),
               "hang_window_s": None if w is None else float(w)}
        if d.get("step") is not None:
            out["step"] = int(d["step"])
        return out
    if kind == "notify":
        return {"rank": rank, "message": str(d["message"]), "level": str(d.get("level",
                                                                             "warning"))}
    if kind == "retryable_errors":
        pats = d.get("patterns")
        if not isinstance(pats, list):
            return None
        return {"rank": rank, "patterns": [str(p) for p in pats]}
    return None


class SdkServer:
    """Receives SDK messages on the agent's event loop and forwards them as notes.

    Each training process connects once (node mode: every rank of the node) and writes
    newline-terminated JSON. Progress is coalesced per rank (the latest step at most every
    PROGRESS_EVERY_S, the last one always forwarded on close); stage, notify and
    retryable_errors pass at once."""

    def __init__(self, note: Note, log: Log, directory: Path | None = None):
        self._note = note
        self._log = log
        self._own_dir = directory is None
        self.dir = Path(tempfile.mkdtemp(prefix="fw-sdk-")) if directory is None else directory
        self.path = str(self.dir / "sdk.sock")
        self.received = 0
        self.malformed = 0
        self._server: asyncio.Server | None = None
        self._conns: set[asyncio.Task[None]] = set()
        self._last_sent: dict[int | None, float] = {}
        self._held: dict[int | None, tuple[dict[str, Any], float]] = {}
        self._timer: asyncio.TimerHandle | None = None

    @property
    def env(self) -> dict[str, str]:
        return {SOCKET_ENV: self.path}

    async def start(self) -> None:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.path)
        self._server = await asyncio.start_unix_server(self._serve, self.path,
                                                       limit=MAX_MESSAGE + 1024, backlog=128)
        os.chmod(self.path, 0o600)

    async def settle(self, timeout: float = 0.5) -> None:
        """The child exited: read what its processes wrote, forward held progress."""
        if self._conns:
            await asyncio.wait(list(self._conns), timeout=timeout)
        if self._timer is not None:
            self._timer.cancel()
        self._flush_held(force=True)

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
        await self.settle(0.2)
        for t in list(self._conns):
            t.cancel()
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.path)
        if self._own_dir:
            shutil.rmtree(self.dir, ignore_errors=True)

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        if len(self._conns) >= _MAX_CONNECTIONS:
            writer.close()
            return
        self._conns.add(task)
        try:
            while True:
                try:
                    raw = await reader.readuntil(b"\n")
                except asyncio.IncompleteReadError:
                    return
                except asyncio.LimitOverrunError:
                    self._log("sdk_message_too_long", limit=MAX_MESSAGE)
                    return
                self.handle(raw)
        except (OSError, asyncio.CancelledError):
            return
        finally:
            self._conns.discard(task)
            writer.close()

    def handle(self, raw: bytes, now: float | None = None) -> None:
        """One datagram from the SDK (public for tests)."""
        self.received += 1
        try:
            m = orjson.loads(raw)
            kind, d = m["k"], m["d"]
            rank = m.get("rank")
            rank = None if rank is None else int(rank)
            ts = float(m.get("ts") or time.time())
            data = _clean(kind, rank, d) if kind in KINDS and isinstance(d, dict) else None
        except (orjson.JSONDecodeError, KeyError, TypeError, ValueError):
            data = None
        if data is None:
            self.malformed += 1
            if self.malformed == 1:
                self._log("sdk_malformed", bytes=len(raw))
            return
        if kind != "progress":
            self._note(kind, data, ts)
            return
        now = time.monotonic() if now is None else now
        if now - self._last_sent.get(rank, -1e18) >= PROGRESS_EVERY_S:
            self._last_sent[rank] = now
            self._held.pop(rank, None)
            self._note("progress", data, ts)
            return
        self._held[rank] = (data, ts)
        if self._timer is None:
            self._timer = asyncio.get_running_loop().call_later(PROGRESS_EVERY_S,
                                                                self._flush_held)

    def _flush_held(self, force: bool = False) -> None:
        self._timer = None
        now = time.monotonic()
        for rank, (data, ts) in list(self._held.items()):
            if force or now - self._last_sent.get(rank, -1e18) >= PROGRESS_EVERY_S:
                del self._held[rank]
                self._last_sent[rank] = now
                self._note("progress", data, ts)
        if self._held and not force:
            self._timer = asyncio.get_running_loop().call_later(PROGRESS_EVERY_S,
                                                                self._flush_held)
