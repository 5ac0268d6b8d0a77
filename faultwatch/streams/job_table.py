"""What the job stage keeps per active job beside its state, for the bounds of its table: the
node names of each active job (the blast-radius guard counts distinct nodes, even for jobs
whose state left the cache) and the jobs that have shown nothing but a run-start, oldest
first (the cheapest to forget when the table is full: JobState.shown_nothing).

Both live in the partition's cache (PartitionCache.names, .cheap) and are rebuilt from the
stored states when a worker takes a partition over, so a restarted processor still knows
which of the jobs it recovered are phantoms.

When many states have left the cache or the table, `release_memory` gives what Python freed
back to the system (a full collection, then glibc's malloc_trim): without it a worker's
resident memory stayed at its peak after a flood of phantom jobs had expired.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import gc
import sys
from collections.abc import Iterable, Mapping
from typing import Any

from faultwatch.core.job import JobState, Phase

ACTIVE = (Phase.RUNNING, Phase.SETTLING)
RELEASE_AFTER = 1000  # states freed before memory is given back ...
RELEASE_EVERY_S = 10.0  # ... at most this often (a full collection takes a while)


def node_names(nodes: Iterable[str]) -> tuple[str, ...]:
    """The node names, interned: one string per node name however many jobs name it."""
    return tuple(sys.intern(n) for n in nodes)


def note(p: Any, key: bytes, st: JobState) -> None:
    """Keep `p.names` and `p.cheap` in step with the state just saved for `key`."""
    if st.phase not in ACTIVE:
        forget(p, key)
        return
    names = p.names.get(key)
    if names is None or len(names) != len(st.nodes):
        p.names[key] = node_names(st.nodes)
    if st.shown_nothing():
        p.cheap.setdefault(key, None)
    else:
        p.cheap.pop(key, None)


def note_raw(p: Any, key: bytes, d: Mapping[str, Any]) -> None:
    """The same for a stored state read as plain data (a partition taken over): the state
    is decoded only when it may have shown nothing."""
    nodes = d.get("nodes") or {}
    p.names[key] = node_names(nodes)
    if not d.get("outputs") and not d.get("hits") and d.get("phase") == Phase.RUNNING:
        try:
            if JobState.from_dict(d).shown_nothing():
                p.cheap.setdefault(key, None)
        except Exception:  # noqa: BLE001 - unreadable: not a candidate; the tick reports it
            pass


def forget(p: Any, key: bytes) -> None:
    p.names.pop(key, None)
    p.cheap.pop(key, None)


def oldest_cheap(parts: Mapping[int, Any]) -> tuple[int, bytes] | None:
    """(partition, key) of a job that has shown nothing, the longest-kept first within its
    partition, from the partition holding the most of them (a phantom flood lands there)."""
    best: tuple[int, int] | None = None
    for partition, p in parts.items():
        if p.cheap and (best is None or len(p.cheap) > best[1]):
            best = (partition, len(p.cheap))
    if best is None:
        return None
    return best[0], next(iter(parts[best[0]].cheap))


def release_memory() -> bool:
    """Collect garbage and return free heap memory to the system (glibc); False where there
    is no malloc_trim (another C library): the collection alone is done."""
    gc.collect()
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        return bool(libc.malloc_trim(0))
    except (OSError, AttributeError):
        return False
