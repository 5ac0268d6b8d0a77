"""The pure grouping core: decisions in, due notifications out, time passed in (no I/O)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

GROUP_FIELDS = ("job", "kind", "action", "run_id", "rule", "category")


def label_of(decision: Mapping[str, Any], name: str) -> str:
    """A grouping label of a decision dict: job, action, run_id at the top; kind, rule and
    category under `reason`."""
    if name in ("kind", "rule", "category"):
        reason = decision.get("reason")
        value = reason.get(name) if isinstance(reason, dict) else None
    else:
        value = decision.get(name)
    return "" if value is None else str(value)


@dataclass(frozen=True)
class GroupingPolicy:
    """Alertmanager's route timers, in seconds, and the labels that form a group."""

    group_by: tuple[str, ...] = ("job", "kind")
    group_wait_s: float = 30.0
    group_interval_s: float = 300.0
    repeat_interval_s: float = 4 * 3600.0
    resolve_timeout_s: float = 300.0  # a decision stays "firing" this long after it arrived
    max_decisions_per_message: int = 20

    def __post_init__(self) -> None:
        unknown = [g for g in self.group_by if g not in GROUP_FIELDS]
        if unknown:
            raise ValueError(f"cannot group by {', '.join(unknown)}; "
                             f"choose from {', '.join(GROUP_FIELDS)}")
        for name in ("group_wait_s", "group_interval_s", "repeat_interval_s",
                     "resolve_timeout_s"):
            if not getattr(self, name) >= 0:
                raise ValueError(f"{name} must be >= 0")
        if self.group_interval_s <= 0:
            raise ValueError("group_interval_s must be > 0")
        if self.max_decisions_per_message < 1:
            raise ValueError("max_decisions_per_message must be >= 1")


@dataclass(frozen=True)
class Notification:
    """One message to send for one group."""

    labels: dict[str, str]
    reason: str  # "initial", "update" (new decisions since the last one) or "repeat"
    decisions: tuple[dict[str, Any], ...]  # newest last, at most max_decisions_per_message
    new_ids: frozenset[str]  # ids first reported in this message
    firing: int  # decisions of the group still firing
    total: int  # decisions the group has seen since it was created
    first_ts: float  # when the group's first decision arrived (now-clock)
    now: float

    @property
    def key(self) -> str:
        return ",".join(f"{k}={v}" for k, v in self.labels.items())


@dataclass
class _Group:
    labels: dict[str, str]
    created_at: float
    flush_at: float
    arrived: dict[str, float] = field(default_factory=dict)  # id -> arrival, firing ones
    decisions: dict[str, dict[str, Any]] = field(default_factory=dict)
    notified: set[str] = field(default_factory=set)
    total: int = 0
    last_sent_at: float | None = None


class Grouper:
    """Groups decisions by labels; `due(now)` says which groups send what, Alertmanager-style.

    A new group waits group_wait_s, then sends every decision it holds. After that it is
    looked at every group_interval_s: it sends again only when decisions arrived since its
    last message, or when repeat_interval_s passed since then and decisions still fire. A
    decision fires for resolve_timeout_s after it arrived; a group with none firing ends."""

    def __init__(self, policy: GroupingPolicy | None = None):
        self.policy = policy or GroupingPolicy()
        self._groups: dict[tuple[str, ...], _Group] = {}
        self._seen: dict[str, float] = {}  # id -> arrival, bounded by resolve_timeout

    def __len__(self) -> int:
        return len(self._groups)

    def add(self, decision: Mapping[str, Any], now: float) -> bool:
        """Take one decision dict; False when its id was already taken (a duplicate)."""
        did = str(decision.get("id", ""))
        if did in self._seen:
            return False
        self._seen[did] = now
        key = tuple(label_of(decision, g) for g in self.policy.group_by)
        group = self._groups.get(key)
        if group is None:
            group = _Group(labels=dict(zip(self.policy.group_by, key, strict=True)),
                           created_at=now, flush_at=now + self.policy.group_wait_s)
            self._groups[key] = group
        group.arrived[did] = now
        group.decisions[did] = dict(decision)
        group.total += 1
        return True

    def next_due(self) -> float | None:
        """The earliest time a group must be looked at, None when there is no group."""
        return min((g.flush_at for g in self._groups.values()), default=None)

    def pending_ids(self) -> set[str]:
        """Ids of decisions taken but not yet in any notification."""
        return {d for g in self._groups.values() for d in g.arrived if d not in g.notified}

    def due(self, now: float) -> list[Notification]:
        """The notifications to send now; advances each group's timers."""
        out: list[Notification] = []
        p = self.policy
        for key in [k for k, g in self._groups.items() if g.flush_at <= now]:
            g = self._groups[key]
            for did in [d for d, t in g.arrived.items() if t + p.resolve_timeout_s <= now
                        and d in g.notified]:
                del g.arrived[did], g.decisions[did]
                g.notified.discard(did)
            new = {d for d in g.arrived if d not in g.notified}
            reason = None
            if new:
                reason = "initial" if g.last_sent_at is None else "update"
            elif g.arrived and g.last_sent_at is not None \
                    and now - g.last_sent_at >= p.repeat_interval_s:
                reason = "repeat"
            if reason is not None:
                shown = list(g.decisions.values())[-p.max_decisions_per_message:]
                out.append(Notification(labels=dict(g.labels), reason=reason,
                                        decisions=tuple(shown), new_ids=frozenset(new),
                                        firing=len(g.arrived), total=g.total,
                                        first_ts=g.created_at, now=now))
                g.notified |= new
                g.last_sent_at = now
            if not g.arrived:
                del self._groups[key]
            else:
                g.flush_at = now + p.group_interval_s
        horizon = now - max(p.resolve_timeout_s, p.group_wait_s) - p.group_interval_s
        for did in [d for d, t in self._seen.items() if t < horizon]:
            del self._seen[did]
        return out
