"""The blast-radius guard: many jobs going lost or hung together is an infrastructure event.

When the share of a worker's active jobs (or of their nodes) that turn lost or hung within
`fleet_storm_window_s` of each other reaches `fleet_storm_share` (and at least
`fleet_storm_min_jobs` jobs), the cause is most likely shared (the network between the nodes
and the broker, the broker, the nodes' storage or power): restarting every job at once would
make it worse. The guard then *holds* the restart/blacklist/fail decisions of those jobs
(and of every job that turns lost or hung while it holds), asks the shell to publish ONE
notice, and ends the episode when the held jobs' reports return (a job whose agents come
back is not acted on for the held episode: its silence was the outage) or, at the latest,
`fleet_storm_hold_max_s` after it tripped. The fallback then: the jobs still silent are
released to their normal decisions at most `fleet_storm_release_per_min` a minute (like the
Kubernetes node lifecycle controller's eviction rate), so a fleet that really died is
restarted, slowly, and a lone lost job is still decided at once.

Anchors: Kubernetes' node lifecycle controller (`--unhealthy-zone-threshold` 0.55 with more
than two unhealthy nodes: a zone in that state is evicted at the secondary rate, a fully
disrupted zone not at all, as the control plane is assumed to have lost contact), and
NVSentinel's fault-quarantine circuit breaker (trips when a share of the cluster was
cordoned within a window; holds further cordons until it is reset).

Pure: no I/O, time passed in. The shell (streams/job_stage.py) asks `consider()` before it
keeps a guarded decision, tells `returned()` when a held job reports, and calls `step()`
on its ticks; `census` is the shell's count of jobs and nodes silent right now.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from faultwatch.core.policy import Policy

GUARDED_KINDS = frozenset({"node-lost", "hang", "progress-stall"})
GUARDED_ACTIONS = frozenset({"restart", "blacklist", "fail"})
NOTICE_KIND = "fleet-storm"
NOTICE_JOB = "(fleet)"  # the notice's job field: no job's name has parentheses around it


@dataclass(frozen=True)
class Census:
    """What the shell sees now: active jobs and their live nodes (distinct names); of them,
    the jobs (keys) and nodes that have sent nothing for at least node_lost_s -
    fleet_storm_window_s, or whose output went silent long enough for a diagnosis request
    (suspected hung)."""

    jobs: int
    nodes: int
    silent: frozenset[bytes]
    silent_nodes: int
    last_heartbeats: tuple[float, ...] = ()  # event time of the silent nodes' last heartbeats
    silent_names: frozenset[str] = frozenset()  # the silent nodes' names


@dataclass(frozen=True)
class Notice:
    """What the shell publishes once per episode (a `notify` decision of kind fleet-storm)."""

    episode: int
    ts: float
    jobs: int
    nodes: int
    of_jobs: int
    of_nodes: int
    cause: str
    evidence: dict[str, Any]


class GuardState(NamedTuple):
    """What the guard is doing, for /metrics (a renamed field fails mypy, not a dashboard)."""

    holding: bool = False
    episode: int = 0  # episodes since the worker started
    held: int = 0  # jobs whose actions are held
    lapsed: int = 0  # jobs still silent after the hold ran out


@dataclass
class BlastGuard:
    """The guard's state (one per worker: it sees the jobs of the partitions it owns)."""

    tripped_at: float | None = None
    episode: int = 0
    # key -> (partition, held at, kind): a node-lost hold ends with any report of the job, a
    # hang/stall hold when its output resumes
    held: dict[bytes, tuple[int, float, str]] = field(default_factory=dict)
    returned_at: dict[bytes, float] = field(default_factory=dict)  # released: return time
    lapsed: dict[bytes, int] = field(default_factory=dict)  # hold ran out: key -> partition
    lapsed_decided: set[bytes] = field(default_factory=set)  # released to a decision
    # guarded decisions acted on: (when, job key, the nodes it named)
    recent: deque[tuple[float, bytes, tuple[str, ...]]] = field(default_factory=deque)
    affected: set[bytes] = field(default_factory=set)  # every job the episode touched
    notices: list[Notice] = field(default_factory=list)  # to publish (take_notices)
    ended: list[dict[str, Any]] = field(default_factory=list)  # episode summaries (to log)
    _acc: tuple[Census, set[bytes], set[str], int] | None = None  # the tally of a census
    _forgotten: int = 0  # entries the window dropped from `recent` (the tally is rebuilt)
    _tokens: float = 0.0
    _tokens_at: float | None = None
    _gaps: list[float] = field(default_factory=list)  # returned jobs' heartbeat gaps

    @property
    def holding(self) -> bool:
        return self.tripped_at is not None

    def consider(self, key: bytes, partition: int, kind: str, action: str, now: float,
                 policy: Policy, census: Callable[[], Census],
                 nodes: tuple[str, ...] = ()) -> bool:
        """True: act on this decision now; False: hold it (the shell keeps the job's state
        undecided and stops re-checking it until `release_due()` or `returned()`).

        Shares count node identities, not jobs: jobs going silent together count at most as
        many as the distinct nodes they are on (40 phantom jobs of one node are one node:
        a node's key cannot trip the guard and hold a real lost node's decision)."""
        if not policy.fleet_storm_detection or kind not in GUARDED_KINDS \
                or action not in GUARDED_ACTIONS:
            return True
        if key in self.lapsed:  # the hold ran out for it and its turn came (release_due)
            if key in self.lapsed_decided:
                self.lapsed.pop(key, None)
                self.lapsed_decided.discard(key)
                return True
            return False
        back = self.returned_at.get(key)
        if back is not None and now - back < policy.fleet_storm_window_s:
            return False  # the held episode's silence, seen as the agents return: no action
        if self.holding:
            self._hold(key, partition, now, kind)
            return False
        self._forget(now, policy)
        c = census()
        # the jobs acted on in the window that are silent no more, with their nodes: counted
        # with the silent ones, each once (sizes only: one consider costs what it adds, not
        # the fleet, so 10,000 lost jobs of one tick are not 10,000 passes over the fleet)
        decided, decided_names = self._acted(c)
        in_decided = key in decided
        jobs = len(c.silent) + len(decided) + (0 if key in c.silent or in_decided else 1)
        jobs -= sum(1 for k in self.lapsed if k in c.silent or k in decided or k == key)
        of_jobs = c.jobs + len(decided) - in_decided
        fresh = {n for n in nodes if n not in c.silent_names and n not in decided_names}
        names = len(c.silent_names) + len(decided_names) + len(fresh)
        of_names = c.nodes + len(decided_names)
        if names:  # as many jobs as distinct nodes at most (shell censuses name them)
            jobs, of_jobs = min(jobs, names), min(of_jobs, max(of_names, names))
        share = jobs / max(1, of_jobs)
        node_share = names / max(1, of_names) if names else c.silent_nodes / max(1, c.nodes)
        if jobs >= policy.fleet_storm_min_jobs and max(share, node_share) >= \
                policy.fleet_storm_share:
            self._trip(key, partition, kind, now, policy, c, jobs, of_jobs)
            return False
        self.recent.append((now, key, tuple(nodes)))
        if key not in c.silent:  # keep the tally of this census in step
            decided.add(key)
            decided_names.update(n for n in nodes if n not in c.silent_names)
        return True

    def _acted(self, c: Census) -> tuple[set[bytes], set[str]]:
        """Of the jobs acted on in the window (`recent`), those census `c` does not count as
        silent, and their nodes it does not name: built once per census (and again after
        the window dropped some), then kept in step by `consider`."""
        acc = self._acc
        if acc is None or acc[0] is not c or acc[3] != self._forgotten:
            keys: set[bytes] = set()
            names: set[str] = set()
            for _, k, named in self.recent:
                if k not in c.silent:
                    keys.add(k)
                    names.update(n for n in named if n not in c.silent_names)
            acc = self._acc = (c, keys, names, self._forgotten)
        return acc[1], acc[2]

    def _hold(self, key: bytes, partition: int, now: float, kind: str) -> None:
        if key not in self.held:
            self.held[key] = (partition, now, kind)
            self.affected.add(key)

    def _trip(self, key: bytes, partition: int, kind: str, now: float, policy: Policy,
              c: Census, jobs: int, of_jobs: int) -> None:
        self.tripped_at = now
        self.episode += 1
        self._gaps = []
        self.affected = set()
        self._hold(key, partition, now, kind)
        hb = sorted(c.last_heartbeats)
        spread = round(hb[-1] - hb[0], 3) if len(hb) > 1 else 0.0
        evidence: dict[str, Any] = {
            "episode": self.episode, "jobs": jobs, "of_jobs": of_jobs,
            "held_now": len(c.silent), "acted_on_before": jobs - len(c.silent | {key}),
            "silent_nodes": c.silent_nodes, "of_nodes": c.nodes,
            "share": round(jobs / max(1, of_jobs), 3),
            "node_share": round(c.silent_nodes / max(1, c.nodes), 3),
            "threshold_share": policy.fleet_storm_share,
            "min_jobs": policy.fleet_storm_min_jobs, "window_s": policy.fleet_storm_window_s,
            "hold_max_s": policy.fleet_storm_hold_max_s,
            "last_heartbeats_spread_s": spread,
            "processor_clock": "caught up (its ticks pass through the broker)"}
        cause = ("the nodes lost the broker together: the network between the nodes and the "
                 "broker, or the nodes themselves (power, storage, a frozen host); this "
                 "processor still reaches the broker")
        if hb and spread <= policy.fleet_storm_window_s:
            cause += f"; their last heartbeats are {spread:.1f}s apart"
        self.notices.append(Notice(self.episode, now, jobs, c.silent_nodes, of_jobs, c.nodes,
                                   cause, evidence))

    def returned(self, key: bytes, now: float, hb_gap_s: float | None = None) -> bool:
        """A held job reported again: release it (no action for the held episode). True when
        it was held. `hb_gap_s`: the gap in its heartbeats' event time across the silence
        (spooled heartbeats arrive late but gapless: the broker or network was away; a gap:
        the agents themselves were stopped)."""
        if key not in self.held:
            return False
        del self.held[key]
        self.returned_at[key] = now
        if hb_gap_s is not None:
            self._gaps.append(hb_gap_s)
        return True

    def step(self, now: float, policy: Policy) -> None:
        """Advance time: end the episode when every held job returned, or when the hold ran
        out (the jobs still held become `lapsed`, released by `release_due`)."""
        self._forget(now, policy)
        if self.tripped_at is None:
            return
        if self.held and now - self.tripped_at < policy.fleet_storm_hold_max_s:
            return
        lapsed = len(self.held)
        for key, (partition, _, _) in self.held.items():
            self.lapsed[key] = partition
        self.held.clear()
        gaps = sorted(self._gaps)
        med = gaps[len(gaps) // 2] if gaps else None
        if med is None:
            cause = "unknown (no job returned)"
        elif med >= policy.fleet_storm_window_s / 2:
            cause = "the agents stopped (their heartbeats have a gap in event time)"
        else:
            cause = ("the broker or the network (the agents spooled: their heartbeats "
                     "arrived late but without a gap)")
        self.ended.append({"episode": self.episode, "held_s": round(now - self.tripped_at, 3),
                           "jobs": len(self.affected), "returned": len(self.affected) - lapsed,
                           "lapsed": lapsed, "heartbeat_gap_median_s": med, "cause": cause})
        self.tripped_at = None
        self._tokens, self._tokens_at = 0.0, now

    def release_due(self, now: float, policy: Policy) -> list[tuple[bytes, int]]:
        """Lapsed jobs whose turn came (at most fleet_storm_release_per_min a minute): the
        shell re-checks them, and their decisions pass `consider` once."""
        if not self.lapsed or self.holding:
            return []
        if self._tokens_at is None:
            self._tokens_at = now
        rate = policy.fleet_storm_release_per_min / 60.0
        self._tokens = min(max(1.0, rate * 60.0),
                           self._tokens + (now - self._tokens_at) * rate)
        self._tokens_at = now
        out: list[tuple[bytes, int]] = []
        for key, partition in self.lapsed.items():
            if self._tokens < 1.0:
                break
            if key in self.lapsed_decided:
                continue
            self._tokens -= 1.0
            self.lapsed_decided.add(key)
            out.append((key, partition))
        return out

    def drop(self, key: bytes) -> None:
        """The job ended or was decided otherwise (exit, error): it is no longer held."""
        self.held.pop(key, None)
        self.lapsed.pop(key, None)
        self.lapsed_decided.discard(key)

    def _forget(self, now: float, policy: Policy) -> None:
        horizon = now - policy.fleet_storm_window_s
        while self.recent and self.recent[0][0] < horizon:
            self.recent.popleft()
            self._forgotten += 1
        if self.returned_at:
            for k in [k for k, t in self.returned_at.items() if t < horizon]:
                del self.returned_at[k]

    def take_notices(self) -> list[Notice]:
        out, self.notices = self.notices, []
        return out

    def take_ended(self) -> list[dict[str, Any]]:
        out, self.ended = self.ended, []
        return out

    def state(self) -> GuardState:
        """For metrics and logs."""
        return GuardState(self.holding, self.episode, len(self.held), len(self.lapsed))
