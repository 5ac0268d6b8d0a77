"""On the node: find the training ranks under the child and capture what they are doing.

Two sources, both without root and without the ranks' cooperation where possible:
- py-spy (PyPI) reads each rank's Python stack from outside; the agent is the ranks'
  ancestor, so ptrace is allowed under Yama's default scope.
- the ranks' own dumps through `faultwatch.rank_dumps` (armed by the SDK or an integration):
  Python stacks and the Flight Recorder trace, written on request into the diag directory.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import time
from pathlib import Path
from typing import Any

PYSPY_TIMEOUT_S = 10.0


def _children() -> dict[int, list[int]]:
    kids: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as f:
                stat = f.read()
        except OSError:
            continue
        # pid (comm) state ppid ...: comm may hold spaces and parentheses
        rest = stat[stat.rfind(b")") + 2:].split()
        if len(rest) > 1:
            kids.setdefault(int(rest[1]), []).append(int(entry))
    return kids


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
    kids = _children()
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


def pyspy() -> str | None:
    """The py-spy executable next to this interpreter, or on PATH."""
    import sys

    here = Path(sys.executable).parent / "py-spy"
    return str(here) if here.exists() else shutil.which("py-spy")


async def pyspy_dump(pid: int, exe: str, timeout_s: float = PYSPY_TIMEOUT_S
                     ) -> tuple[list[dict[str, Any]] | None, str | None]:
    """(threads, None) of one process, or (None, why not)."""
    try:
        proc = await asyncio.create_subprocess_exec(
            exe, "dump", "--pid", str(pid), "--json", stdout=asyncio.subprocess.PIPE,
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
    """Ask the armed ranks for their dumps (see faultwatch.rank_dumps); wait until every
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
    return got
