"""In a training rank: dump this process's Python stacks and Flight Recorder trace on request.

The agent asks by creating `<dir>/request-<n>` (dir = $FAULTWATCH_DIAG_DIR, set by the agent in
the child's environment); a daemon thread of every rank that imported `faultwatch.sdk` (or a
framework integration) polls for it and writes `<dir>/rank<R>-<n>.json` atomically:

    {"rank": R, "pid": ..., "ts": ..., "threads": [{"thread_name", "main", "frames": [...]}],
     "flight_recorder": {...} | null, "fr_error": "..." | null}

It never touches the main thread: a rank blocked inside a collective still answers (Python
stacks from sys._current_frames, the Flight Recorder through torch's C++ dump call, which
works while the main thread waits in gloo or NCCL). Armed only when the agent enabled it, at
most one thread per process, and every failure is swallowed: diagnostics never hurt training.
"""

from __future__ import annotations

import json
import os
import sys
import threading
import time
from pathlib import Path
from typing import Any

from faultwatch import settings

DIR_ENV = settings.DIAG_DIR.name
ARMED_PREFIX = "armed-"  # <dir>/armed-<pid>: this process answers requests (the agent waits)
POLL_S = 0.25
MAX_FRAMES = 64

_started: int | None = None  # pid of the process whose watcher runs (re-armed after fork)


def _rank() -> int:
    try:
        return int(os.environ.get("RANK", "0"))
    except ValueError:
        return 0


def python_stacks() -> list[dict[str, Any]]:
    """Every thread's frames, innermost first (py-spy's JSON shape)."""
    names = {t.ident: t.name for t in threading.enumerate()}
    main = threading.main_thread().ident
    out = []
    for ident, frame in sys._current_frames().items():  # noqa: SLF001 - the stdlib way
        frames: list[dict[str, Any]] = []
        f: Any = frame
        while f is not None and len(frames) < MAX_FRAMES:
            co = f.f_code
            frames.append({"name": co.co_name, "filename": co.co_filename,
                           "line": f.f_lineno})
            f = f.f_back
        out.append({"thread_name": names.get(ident, str(ident)), "main": ident == main,
                    "frames": frames})
    return out


def flight_recorder() -> tuple[dict[str, Any] | None, str | None]:
    """This process's Flight Recorder trace as a dict, or (None, why not)."""
    mod = sys.modules.get("torch.distributed")
    if mod is None:
        return None, "torch.distributed not imported"
    try:
        if not mod.is_initialized():
            return None, "no process group"
        import torch

        c10d = torch._C._distributed_c10d  # noqa: SLF001 - the documented dump entry point
        if hasattr(c10d, "_dump_fr_trace_json"):
            raw = c10d._dump_fr_trace_json(includeCollectives=True, onlyActive=False)  # noqa: SLF001
        elif hasattr(c10d, "_dump_nccl_trace_json"):
            raw = c10d._dump_nccl_trace_json(includeCollectives=True, onlyActive=False)  # noqa: SLF001
        else:
            return None, "this torch has no Flight Recorder dump"
        text = raw.decode() if isinstance(raw, bytes) else str(raw)
        return json.loads(text), None
    except Exception as e:  # noqa: BLE001 - diagnostics never raise into training
        return None, f"{type(e).__name__}: {e}"[:300]


def write_dump(directory: Path, n: str) -> Path:
    rank = _rank()
    fr, err = flight_recorder()
    doc = {"rank": rank, "pid": os.getpid(), "ts": time.time(), "request": n,
           "threads": python_stacks(), "flight_recorder": fr, "fr_error": err}
    path = directory / f"rank{rank}-{n}.json"
    tmp = directory / f".rank{rank}-{n}.{os.getpid()}.tmp"
    tmp.write_text(json.dumps(doc, default=str))
    os.replace(tmp, path)
    return path


def _watch(directory: Path) -> None:
    done: set[str] = set()
    while True:
        try:
            for req in directory.glob("request-*"):
                n = req.name[len("request-"):]
                if n not in done:
                    done.add(n)
                    write_dump(directory, n)
        except Exception:  # noqa: BLE001, S110 - never raise into training
            pass
        time.sleep(POLL_S)


def arm() -> bool:
    """Start the watcher if the agent set $FAULTWATCH_DIAG_DIR (idempotent per process)."""
    global _started
    path = settings.DIAG_DIR.get()
    if path is None or _started == os.getpid():
        return False
    if not path.is_dir():
        return False
    _started = os.getpid()
    try:
        (path / f"{ARMED_PREFIX}{os.getpid()}").touch()
    except OSError:
        return False
    threading.Thread(target=_watch, args=(path,), name="faultwatch-dumps", daemon=True).start()
    return True
