"""On the node: find the training ranks under the child, capture what they are doing, and
answer the job stage's `diagnose` requests with a bounded `diagnosis` note.

Two sources, both without root and without the ranks' cooperation where possible:
- py-spy (PyPI) reads each rank's Python stack from outside; the agent is the ranks'
  ancestor, so ptrace is allowed under Yama's default scope.
- the ranks' own dumps through `faultwatch.sdk.rank_dumps` (armed by the SDK or an integration):
  Python stacks and the Flight Recorder trace, written on request into the diag directory.
"""

from __future__ import annotations

import asyncio
import importlib.metadata
import json
import os
import shutil
import tempfile
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from faultwatch.agents.child import children_map
from faultwatch.dumps import flight_recorder, stacks
from faultwatch.sdk import rank_dumps

PYSPY_TIMEOUT_S = 10.0


def _environ(pid: int) -> dict[str, str]:
    try:
        with open(f"/proc/{pid}/environ", "rb") as f:
            raw = f.read()
    except OSError:
        return {}
    out = {}
    for item in raw.split(b"\0"):
        k, sep, v = item.partition(b"=")
        if sep:
            out[k.decode(errors="replace")] = v.decode(errors="replace")
    return out


def rank_pids(root: int) -> dict[int, int]:
    """Global rank -> pid of every process below `root` (inclusive) with RANK in its env.

    A rank's own subprocesses (data loader workers) inherit RANK: the shallowest wins."""
    kids = children_map()
    out: dict[int, int] = {}
    frontier = [root]
    while frontier:
        nxt: list[int] = []
        for pid in frontier:
            rank = _environ(pid).get("RANK", "")
            if rank.isdigit() and int(rank) not in out and pid != root:
                out[int(rank)] = pid
                continue  # its children are its workers
            nxt.extend(kids.get(pid, ()))
        frontier = nxt
    if not out:
        rank = _environ(root).get("RANK", "")
        if rank.isdigit():
            out[int(rank)] = root
    return out


def _stat(pid: int) -> list[str] | None:
    """The fields of /proc/PID/stat after "pid (comm) " (state first), or None when gone."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            raw = f.read().decode(errors="replace")
    except OSError:
        return None
    return raw[raw.rfind(")") + 2:].split()


def cpu_seconds(pid: int) -> float | None:
    """CPU time (user + system, every thread) the process has used, or None when gone. A rank
    stuck in a wait uses almost none between two captures; a rank making progress does."""
    fields = _stat(pid)
    try:
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK") \
            if fields is not None else None
    except (IndexError, ValueError, OSError):
        return None


def proc_state(pid: int) -> str | None:
    """The process's scheduler state from /proc/PID/stat (its main thread's): R running,
    S sleeping (a lock, a socket, a sleep), D in uninterruptible I/O (disk, NFS), ..."""
    fields = _stat(pid)
    return fields[0][:1] if fields else None


def tree_cpu_seconds(pid: int, kids: Mapping[int, list[int]]) -> float | None:
    """CPU seconds of the process and every descendant alive now (a rank's data-loader and
    compile workers work for it): None when the process itself is gone."""
    own = cpu_seconds(pid)
    if own is None:
        return None
    total, frontier = own, list(kids.get(pid, ()))
    while frontier:
        p = frontier.pop()
        total += cpu_seconds(p) or 0.0
        frontier.extend(kids.get(p, ()))
    return total


def running_descendants(pid: int, kids: Mapping[int, list[int]]) -> int:
    """How many of the process's descendants are on CPU or in disk I/O now (state R or D): a
    data-loader or compile worker at work, even when a loaded machine gives it little CPU."""
    n, frontier = 0, list(kids.get(pid, ()))
    while frontier:
        p = frontier.pop()
        n += proc_state(p) in ("R", "D")
        frontier.extend(kids.get(p, ()))
    return n


def cpu_sample(pids: Mapping[int, int]) -> dict[int, tuple[float | None, str | None, int]]:
    """rank -> (CPU seconds of its process tree, its state, descendants at work) now."""
    kids = children_map()
    return {r: (tree_cpu_seconds(p, kids), proc_state(p), running_descendants(p, kids))
            for r, p in pids.items()}


def pyspy() -> str | None:
    """The py-spy executable next to this interpreter, or on PATH."""
    import sys

    here = Path(sys.executable).parent / "py-spy"
    return str(here) if here.exists() else shutil.which("py-spy")


async def pyspy_dump(pid: int, exe: str, timeout_s: float = PYSPY_TIMEOUT_S
                     ) -> tuple[list[dict[str, Any]] | None, str | None]:
    """(threads, None) of one process, or (None, why not). Python frames first (a short
    pause); native frames too when only they tell what an idle rank waits for
    (stacks.needs_native: DDP's gradient all-reduce inside backward)."""
    threads, err = await _pyspy(pid, exe, timeout_s, native=False)
    if threads is not None and stacks.needs_native(threads):
        deep, _why = await _pyspy(pid, exe, timeout_s, native=True)
        if deep is not None:  # unwinding may be unsupported here: the Python view stays
            return deep, None
    return threads, err


async def _pyspy(pid: int, exe: str, timeout_s: float, native: bool
                 ) -> tuple[list[dict[str, Any]] | None, str | None]:
    try:
        proc = await asyncio.create_subprocess_exec(
            exe, "dump", "--pid", str(pid), "--json", *(["--native"] if native else []),
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE, stdin=asyncio.subprocess.DEVNULL)
    except OSError as e:
        return None, str(e)
    try:
        out, err = await asyncio.wait_for(proc.communicate(), timeout_s)
    except TimeoutError:
        proc.kill()
        await proc.wait()
        return None, f"py-spy timed out after {timeout_s:g}s"
    if proc.returncode != 0:
        return None, err.decode(errors="replace").strip()[-300:] or f"exit {proc.returncode}"
    try:
        threads = json.loads(out)
    except ValueError as e:
        return None, f"py-spy printed no JSON: {e}"
    return (threads, None) if isinstance(threads, list) else (None, "unexpected py-spy output")


async def stacks_of(ranks: dict[int, int], timeout_s: float = PYSPY_TIMEOUT_S
                    ) -> tuple[dict[int, list[dict[str, Any]]], dict[int, str]]:
    """Every rank's threads via py-spy, concurrently; (stacks, errors by rank)."""
    exe = pyspy()
    if exe is None:
        return {}, {r: "py-spy not installed" for r in ranks}
    results = await asyncio.gather(*(pyspy_dump(pid, exe, timeout_s) for pid in ranks.values()))
    stacks: dict[int, list[dict[str, Any]]] = {}
    errors: dict[int, str] = {}
    for rank, (threads, err) in zip(ranks, results, strict=True):
        if threads is not None:
            stacks[rank] = threads
        else:
            errors[rank] = err or "?"
    return stacks, errors


async def request_rank_dumps(directory: Path, ranks: set[int] | None, timeout_s: float = 10.0
                             ) -> dict[int, dict[str, Any]]:
    """Ask the armed ranks for their dumps (see faultwatch.sdk.rank_dumps); wait until every
    expected rank answered or timeout_s passed. Returns rank -> dump document."""
    n = f"{int(time.time() * 1000)}-{os.getpid()}"
    (directory / f"request-{n}").touch()
    deadline = time.monotonic() + timeout_s
    got: dict[int, dict[str, Any]] = {}
    while time.monotonic() < deadline:
        for p in directory.glob(f"rank*-{n}.json"):
            try:
                rank = int(p.name[4:p.name.index("-")])
            except ValueError:
                continue
            if rank not in got:
                try:
                    got[rank] = json.loads(p.read_text())
                except (OSError, ValueError):
                    continue
        if ranks is not None and ranks <= set(got):
            break
        await asyncio.sleep(0.1)
    for p in [directory / f"request-{n}", *directory.glob(f"rank*-{n}.json")]:
        p.unlink(missing_ok=True)
    return got


# ---- answering `diagnose` decisions ---------------------------------------------------------

FR_BUFFER_ENTRIES = "2000"  # Flight Recorder ring size the agent enables (torch's NCCL default)
SDK_DUMP_TIMEOUT_S = 8.0  # armed ranks answer within this (the first FR dump takes 1-2 s)
MAX_RANKS = 256  # ranks captured per node and note
# The Flight Recorder's ring size: torch >= 2.8 reads TORCH_FR_BUFFER_SIZE (the NCCL name still
# works there but warns on every rank that it is deprecated); older torch reads only the NCCL
# name (pytorch/pytorch#152563 made the recorder backend-neutral).
FR_BUFFER_KEYS = ("TORCH_FR_BUFFER_SIZE", "TORCH_NCCL_TRACE_BUFFER_SIZE")
FR_RENAMED_IN = (2, 8)


def fr_buffer_keys(torch_version: str | None) -> tuple[str, ...]:
    """The one variable the installed torch understands; both when the version is unknown."""
    if not torch_version:
        return FR_BUFFER_KEYS
    try:
        major, minor = (int(x) for x in torch_version.split("+")[0].split(".")[:2])
    except ValueError:
        return FR_BUFFER_KEYS
    return FR_BUFFER_KEYS[:1] if (major, minor) >= FR_RENAMED_IN else FR_BUFFER_KEYS[1:]


def installed_torch_version() -> str | None:
    """torch's version from its metadata (never imports torch: the agent must not need it)."""
    try:
        return importlib.metadata.version("torch")
    except importlib.metadata.PackageNotFoundError:
        return None


class Diagnoser:
    """Answers the job stage's `diagnose` requests (core/diagnosis.py): captures every rank
    under the running child (py-spy, else the rank's own SDK dump; the Flight Recorder when
    the SDK armed it) and ships one bounded `diagnosis` note. One capture at a time; never
    touches the child beyond reading it."""

    def __init__(self, note: Callable[[str, dict[str, Any]], None], log: Callable[..., None],
                 base_env: Mapping[str, str]):
        self._note, self._log = note, log
        self.dir = Path(tempfile.mkdtemp(prefix="faultwatch-diag-"))
        self.env = {rank_dumps.DIR_ENV: str(self.dir)}
        if not any(k in base_env for k in FR_BUFFER_KEYS):  # the user's own setting wins
            for key in fr_buffer_keys(installed_torch_version()):
                self.env[key] = FR_BUFFER_ENTRIES
        self._task: asyncio.Task[None] | None = None
        self.answered = 0

    def on_decision(self, dec_id: str, child_pid: int | None) -> None:
        """Start a capture for a `diagnose` decision unless one is running."""
        if child_pid is None or (self._task is not None and not self._task.done()):
            return
        self._task = asyncio.create_task(self._answer(dec_id, child_pid),
                                         name="faultwatch-diagnose")

    async def _answer(self, dec_id: str, child_pid: int) -> None:
        t0 = time.monotonic()
        try:
            data = await capture(child_pid, self.dir)
        except Exception as e:  # noqa: BLE001 - a failed capture is reported, never fatal
            data = {"ranks": {}, "errors": {"capture": f"{type(e).__name__}: {e}"[:300]}}
        data.update(request=dec_id, took_s=round(time.monotonic() - t0, 3))
        self._note("diagnosis", data)
        self.answered += 1
        self._log("diagnosis_sent", request=dec_id, ranks=len(data["ranks"]),
                  errors=len(data["errors"]), took_s=data["took_s"])

    def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
        shutil.rmtree(self.dir, ignore_errors=True)


def armed_pids(diag_dir: Path) -> set[int]:
    """Pids of the processes whose dump watcher runs (faultwatch.sdk.rank_dumps.arm marks them)."""
    out = set()
    for p in diag_dir.glob(f"{rank_dumps.ARMED_PREFIX}*"):
        tail = p.name[len(rank_dumps.ARMED_PREFIX):]
        if tail.isdigit():
            out.add(int(tail))
    return out


async def capture(child_pid: int, diag_dir: Path | None) -> dict[str, Any]:
    """The note data for every rank under child_pid: per rank a stack digest
    (stacks.RankActivity), its source, and its trimmed Flight Recorder dump as JSON text."""
    pids = await asyncio.to_thread(rank_pids, child_pid)
    if not pids:  # not a torchrun job: the child is the one rank
        pids = {0: child_pid}
    pids = dict(sorted(pids.items())[:MAX_RANKS])
    armed: set[int] = set()
    if diag_dir is not None:
        marked = await asyncio.to_thread(armed_pids, diag_dir)
        armed = {r for r, pid in pids.items() if pid in marked}
    own: asyncio.Task[dict[int, dict[str, Any]]] | None = None
    if armed and diag_dir is not None:
        own = asyncio.create_task(request_rank_dumps(diag_dir, armed, SDK_DUMP_TIMEOUT_S))
    t0, before = time.monotonic(), await asyncio.to_thread(cpu_sample, pids)
    spied, errors = await stacks_of(pids)
    dumps = await own if own is not None else {}
    dt, after = time.monotonic() - t0, await asyncio.to_thread(cpu_sample, pids)
    ranks: dict[str, dict[str, Any]] = {}
    errs: dict[str, str] = {}
    for rank in pids:
        threads: list[dict[str, Any]] | None = spied.get(rank)
        source = "py-spy"
        d = dumps.get(rank) or {}
        if threads is None and d.get("threads"):
            threads, source = d["threads"], "sdk"
        c0, state, k0 = before.get(rank, (None, None, 0))
        c1, _, k1 = after.get(rank, (None, None, 0))
        entry: dict[str, Any] = {"source": source if threads is not None else "",
                                 "stack": None, "fr": None, "cpu_s": c1, "proc_state": state,
                                 "workers_running": max(k0, k1)}
        if c0 is not None and c1 is not None and dt > 0.05:  # busy while it was captured
            entry["cpu_frac"] = round(max(0.0, c1 - c0) / dt, 3)
        if threads is not None:
            entry["stack"] = stacks.classify(rank, threads).to_dict()
        else:
            errs[str(rank)] = errors.get(rank, "no stack")[:300]
        fr = d.get("flight_recorder")
        if isinstance(fr, dict):
            entry["fr"] = json.dumps(flight_recorder.trim(fr), default=str)
        elif d.get("fr_error"):
            entry["fr_error"] = str(d["fr_error"])[:300]
        ranks[str(rank)] = entry
    return {"ranks": ranks, "errors": errs, "armed": sorted(armed),
            "pids": {str(r): p for r, p in pids.items()}}
