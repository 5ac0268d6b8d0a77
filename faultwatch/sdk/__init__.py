"""Training SDK: progress, stages, retryable errors and notices sent to the local agent.

    from faultwatch import sdk

    sdk.set_retryable_errors(["CUDA error: an illegal memory access"])
    with sdk.stage("init", hang_window_s=1800):
        model = build()
    mon = sdk.StepMonitor()
    for step, batch in enumerate(loader):
        loss = train_step(batch)
        mon.step(step, loss=loss, lr=sched.get_last_lr()[0])
        if step % 1000 == 0:
            with sdk.stage("eval", hang_window_s=None):  # no hang detection while evaluating
                evaluate()

No Kafka client runs in the training process: every call is one non-blocking message on
the agent's Unix socket named by $FAULTWATCH_SDK_SOCKET. Without an agent (the variable is
unset, the socket is gone) or when the socket's buffer is full, calls are silent no-ops; they
never raise and never block the training loop. The rank comes from $RANK (torchrun).
"""

from __future__ import annotations

import atexit
import functools
import math
import os
import socket
import threading
import time
from collections.abc import Callable, Iterable
from typing import Any, TypeVar

import orjson

from faultwatch import settings
from faultwatch.sdk import rank_dumps

SOCKET_ENV = settings.SDK_SOCKET.name
MAX_MESSAGE = 60 * 1024
RECONNECT_S = 1.0  # without an agent, try to connect at most once a second
PROGRESS_MIN_INTERVAL_S = 0.1  # at most 10 progress messages/s per process reach the agent

F = TypeVar("F", bound=Callable[..., Any])


class _Channel:
    """The process's stream connection to the agent (re-made after fork), never blocking.

    Messages are newline-terminated JSON. A Unix stream socket buffers ~200 KiB, so bursts
    are absorbed (a datagram socket would queue only net.unix.max_dgram_qlen = 10 messages);
    when the buffer is full the message is dropped and counted."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._pid = -1
        self._sock: socket.socket | None = None
        self._tail = b""  # the unsent rest of a partially sent message
        self._next_connect = -math.inf
        self.path: str | None = None
        self.sent = 0
        self.dropped = 0
        self._last_progress = -math.inf
        self._held: tuple[dict[str, Any], float] | None = None

    def _drop_socket(self) -> None:
        if self._sock is not None:
            self._sock.close()
        self._sock, self._tail = None, b""
        self._next_connect = time.monotonic() + RECONNECT_S

    def _socket(self) -> socket.socket | None:
        path = settings.SDK_SOCKET.raw()
        if not path:
            return None
        if self._pid != os.getpid() or self.path != path:  # forked, or another agent
            if self._sock is not None and self._pid == os.getpid():
                self._sock.close()
            self._sock, self._tail, self._pid, self.path = None, b"", os.getpid(), path
            self._next_connect = -math.inf
        if self._sock is None and time.monotonic() >= self._next_connect:
            s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            s.setblocking(False)
            try:
                s.connect(path)
            except OSError:  # no agent (yet), or its backlog is full
                s.close()
                self._next_connect = time.monotonic() + RECONNECT_S
                return None
            self._sock = s
        return self._sock

    def send(self, kind: str, data: dict[str, Any], ts: float | None = None) -> bool:
        """Send one message; False (and nothing raised) when it could not be delivered."""
        if kind != "progress" and self._held is not None:
            self.flush()
        try:
            with self._lock:
                s = self._socket()
                if s is None:
                    self.dropped += 1
                    return False
                if self._tail:
                    self._tail = self._tail[s.send(self._tail):]
                    if self._tail:
                        self.dropped += 1
                        return False
                msg = orjson.dumps({"k": kind, "rank": _rank(), "ts": ts or time.time(), "d": data},
                                   option=orjson.OPT_SERIALIZE_NUMPY, default=_jsonable)
                if len(msg) > MAX_MESSAGE:
                    self.dropped += 1
                    return False
                msg += b"\n"
                self._tail = msg[s.send(msg):]
                self.sent += 1
                return True
        except BlockingIOError:  # the agent's buffer is full: drop, never wait
            self.dropped += 1
            return False
        except OSError:  # the agent went away: reconnect later
            with self._lock:
                self._drop_socket()
            self.dropped += 1
            return False
        except (TypeError, ValueError):  # unserialisable data
            self.dropped += 1
            return False

    def progress(self, data: dict[str, Any]) -> None:
        """Send progress at most every PROGRESS_MIN_INTERVAL_S; the latest one is held and
        goes out with the next message or at exit, so the last step is never lost."""
        now = time.monotonic()
        if now - self._last_progress < PROGRESS_MIN_INTERVAL_S:
            self._held = (data, time.time())
            return
        self._last_progress = now
        self._held = None
        self.send("progress", data)

    def flush(self) -> None:
        held, self._held = self._held, None
        if held is not None:
            self.send("progress", held[0], held[1])


_channel = _Channel()
atexit.register(lambda: _channel.flush())
rank_dumps.arm()  # answers the agent's dump requests (stacks, Flight Recorder), if enabled


def _rank() -> int | None:
    r = os.environ.get("RANK")
    try:
        return int(r) if r else None
    except ValueError:
        return None


def _jsonable(x: Any) -> Any:
    """Tensors and numpy scalars as floats; anything else as its str()."""
    try:
        return float(x)
    except (TypeError, ValueError):
        return str(x)


def _metric(v: Any) -> Any:
    if isinstance(v, bool | int | str) or v is None:
        return v
    try:
        f = float(v)
    except (TypeError, ValueError):
        return str(v)
    return f if math.isfinite(f) else str(f)  # JSON has no NaN/Inf: "nan", "inf"


def enabled() -> bool:
    """Whether an agent's socket is configured for this process."""
    return settings.SDK_SOCKET.is_set()


def progress(step: int, *, step_time_s: float | None = None, **metrics: Any) -> None:
    """Report the training step (liveness and progress) with optional metrics."""
    if not enabled():
        return
    d: dict[str, Any] = {"step": int(step), "metrics": {k: _metric(v) for k, v in metrics.items()}}
    if step_time_s is not None:
        d["step_time_s"] = float(step_time_s)
    _channel.progress(d)


def set_retryable_errors(patterns: Iterable[str]) -> None:
    """Job-specific log keywords/regexes whose failures are retryable (restart the job)."""
    _channel.send("retryable_errors", {"patterns": [str(p) for p in patterns]})


def notify(message: str, level: str = "warning") -> None:
    """A custom message that becomes a `notify` decision (e.g. "loss is NaN")."""
    _channel.send("notify", {"message": str(message)[:4000], "level": str(level)})


class stage:  # noqa: N801 - used like a function: `with sdk.stage(...)`, `@sdk.stage(...)`
    """A named phase with its own hang window: a context manager and a decorator.

    hang_window_s is how long every rank may be silent in this stage before the job counts
    as hung; None disables hang detection (e.g. evaluation, checkpointing). Leaving the
    stage restores the job's window. `step` names the training step a stage is about (the
    step a checkpoint saves: goodput's lost work counts from it, docs/goodput.md)."""

    def __init__(self, name: str, *, hang_window_s: float | None, step: int | None = None):
        self.name = str(name)
        self.hang_window_s = None if hang_window_s is None else float(hang_window_s)
        self.step = None if step is None else int(step)

    def _send(self, opens: bool) -> None:
        d: dict[str, Any] = {"stage": self.name, "opens": opens,
                             "hang_window_s": self.hang_window_s}
        if self.step is not None:
            d["step"] = self.step
        _channel.send("stage", d)

    def __enter__(self) -> stage:
        self._send(True)
        return self

    def __exit__(self, *exc: object) -> None:
        self._send(False)

    def __call__(self, fn: F) -> F:
        @functools.wraps(fn)
        def wrapper(*a: Any, **kw: Any) -> Any:
            with self:
                return fn(*a, **kw)
        return wrapper  # type: ignore[return-value]


class StepMonitor:
    """For torch training loops: per-rank step time, progress, and a NaN/Inf loss check.

    Call step(step, loss=..., **metrics) once per optimizer step. The loss may be a tensor;
    it is read (loss.item(), a device sync) only every `check_every` steps. A non-finite
    loss sends one `notify` (level error) per `nan_notify_every` steps at most."""

    def __init__(self, check_every: int = 1, nan_notify_every: int = 100):
        self.check_every = max(1, check_every)
        self.nan_notify_every = max(1, nan_notify_every)
        self._last_ts: float | None = None
        self._last_nan_step: int | None = None
        self.rank = _rank()
        self.nan_steps = 0

    def _rank(self) -> int | None:
        if self.rank is not None:
            return self.rank
        try:
            import torch.distributed as dist  # only here: the rest of the SDK needs no torch
        except ImportError:
            return None
        if dist.is_available() and dist.is_initialized():
            self.rank = dist.get_rank()
        return self.rank

    def step(self, step: int, loss: Any = None, **metrics: Any) -> float | None:
        """Record one finished step; returns the step time in seconds (None for the first)."""
        now = time.monotonic()
        dt = None if self._last_ts is None else now - self._last_ts
        self._last_ts = now
        if not enabled():
            return dt
        if loss is not None and step % self.check_every == 0:
            value = float(loss.item() if hasattr(loss, "item") else loss)
            metrics["loss"] = value
            if not math.isfinite(value):
                self.nan_steps += 1
                last = self._last_nan_step
                if last is None or step - last >= self.nan_notify_every:
                    self._last_nan_step = step
                    notify(f"loss is {value} at step {step} on rank {self._rank()}", "error")
        progress(step, step_time_s=dt, **metrics)
        return dt
