"""Which job status snapshots a processor publishes, and when: a job's at once when what
`faultwatch status` and `faultwatch diagnose` read of it changed, every job's at a cadence
that scales with the jobs this worker holds (at most STATUS_MAX_PER_S refreshes a second)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from faultwatch.core.policy import Policy
from faultwatch.core.state import JobState, Phase
from faultwatch.core.status import STATUS_S, snapshot
from faultwatch.wire import encode_status

STATUS_MAX_PER_S = 100.0  # per worker: snapshots of unchanged jobs, spread over the calls
ACTIVE = (Phase.RUNNING, Phase.SETTLING)

Material = tuple[Any, ...]


class Partitions(Protocol):
    """What the publisher reads of a signals partition's cache (job_stage.PartitionCache)."""

    cache: dict[bytes, JobState]
    active: set[bytes]
    ended: set[bytes]  # decided or done since the last look (emptied by the publisher)


def material(st: JobState) -> Material:
    """What a snapshot's reader acts on (`faultwatch diagnose` reads run, attempt, phase and
    live nodes; a hot spare leaves once its run is done): run, attempt, phase, restarts,
    decisions, each node's liveness and exit, each spare's state.
    Not the ages and step counter that change with every line, the ranks seen (they grow
    as each node first prints), nor open stages and the window (an eval or checkpoint opens
    and closes one every minute or so per job): at 5,000 jobs those made ~180 snapshots a
    second. The refresh shows them."""
    return (st.run_id, st.attempt, st.phase, st.restarts_used, len(st.decided),
            st.decided[-1] if st.decided else None,
            tuple(sorted((n.node, n.alive, n.exit_code) for n in st.nodes.values())),
            tuple(sorted((s.node, s.state, s.checks, s.registry) for s in st.spares.values())))


@dataclass
class _Seen:
    material: Material  # what a reader acts on, in the job's last snapshot
    published_s: float  # when that snapshot was published (no state is kept: ~3 µs a job to
    # compare each time, against holding an old state per job alive)


class StatusPublisher:
    """Called every `status_s` with the partitions this worker owns; returns (key, record)
    pairs to send to the compacted status topic:

    * a job seen for the first time, or whose `material` changed since its last snapshot;
    * a job that left the active phases (decided, done): one last snapshot, then it is
      forgotten. That includes a job that started and ended between two calls (a crash at
      start, a command that succeeds at once): it was never published while running, and
      is the job an operator most needs to see (`PartitionCache.ended`);
    * unchanged active jobs, oldest snapshot first, at most `max_per_s * status_s` a call
      (less what changed), each no more often than every `status_s`: with N jobs a job's
      snapshot is refreshed every max(status_s, N / max_per_s) seconds.
    """

    def __init__(self, status_s: float = STATUS_S, max_per_s: float = STATUS_MAX_PER_S
                 ) -> None:
        self.status_s = status_s
        self.max_per_s = max_per_s
        self.seen: dict[bytes, _Seen] = {}  # ordered by publication, oldest first

    def refresh_s(self, jobs: int) -> float:
        """How often an unchanged job's snapshot is refreshed when `jobs` are held."""
        return max(self.status_s, jobs / self.max_per_s)

    def due(self, parts: Sequence[Partitions], now: float, policy: Policy
            ) -> list[tuple[bytes, bytes]]:
        """The snapshots to publish now, as (job key, status record)."""
        seen = self.seen
        active: dict[bytes, JobState] = {}
        for p in parts:
            cache = p.cache
            for key in p.active:
                st = cache.get(key)
                if st is not None:
                    active[key] = st
        out: list[tuple[bytes, bytes]] = []
        for key in [k for k in seen if k not in active]:  # left the active phases or us
            del seen[key]
        for p in parts:  # ended since the last call: their last snapshot
            for key in p.ended:
                last = p.cache.get(key)
                if last is not None and last.phase not in ACTIVE and key not in active:
                    out.append((key, encode_status(snapshot(last, now, policy))))
            p.ended.clear()
        publish: dict[bytes, Material] = {}
        for key, st in active.items():
            m = material(st)
            s = seen.get(key)
            if s is None or m != s.material:
                publish[key] = m
        budget = int(self.max_per_s * self.status_s) - len(publish)
        for key, s in seen.items():  # unchanged ones, oldest snapshot first
            if budget <= 0 or now - s.published_s < self.status_s:
                break
            if key not in publish:
                publish[key] = s.material
                budget -= 1
        for key, m in publish.items():
            seen.pop(key, None)
            seen[key] = _Seen(m, now)  # to the end: the newest snapshot
            out.append((key, encode_status(snapshot(active[key], now, policy))))
        return out
