"""Rate limits and digests for notifications, pure (time passed in, no I/O).

Each webhook has a token bucket (`per_webhook_per_min` posts a minute, as many at once), and
all webhooks share one more (`total_per_min`). A notification that finds no token in its
webhook's bucket or in the shared one is not posted: its decisions are counted into that
webhook's digest, sent `digest_interval_s` after the first one it holds ("37 more decisions in
the last minute, by kind and job"). A digest takes no token (at most one per webhook per
interval). Posts to one webhook are spaced by `min_gap_s` (Slack takes about one a second).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

from faultwatch.notify.grouping import Notification, label_of

TOP = 10  # jobs and kinds named in a digest; the rest are counted


@dataclass(frozen=True)
class RateLimits:
    per_webhook_per_min: float = 20.0
    total_per_min: float = 60.0
    digest_interval_s: float = 60.0
    min_gap_s: float = 1.0

    def __post_init__(self) -> None:
        for name in ("per_webhook_per_min", "total_per_min", "digest_interval_s"):
            if not getattr(self, name) > 0:
                raise ValueError(f"{name} must be > 0")
        if not self.min_gap_s >= 0:
            raise ValueError("min_gap_s must be >= 0")


@dataclass
class Digest:
    """Decisions a webhook did not get one by one: counted by kind and by job."""

    since: float
    now: float = 0.0
    decisions: int = 0
    messages: int = 0
    by_kind: Counter[str] = field(default_factory=Counter)
    by_job: Counter[str] = field(default_factory=Counter)
    new_ids: set[str] = field(default_factory=set)

    # the fields `deliver` logs, as a Notification has them
    key = "digest"
    reason = "digest"

    @property
    def firing(self) -> int:
        return self.decisions

    def add(self, note: Notification) -> None:
        self.messages += 1
        for d in note.decisions:
            if str(d.get("id")) in note.new_ids:
                self.by_kind[label_of(d, "kind") or "?"] += 1
                self.by_job[label_of(d, "job") or "?"] += 1
        shown_new = sum(1 for d in note.decisions if str(d.get("id")) in note.new_ids)
        unseen = len(note.new_ids) - shown_new  # new ones beyond the note's shown decisions
        if unseen > 0:
            self.by_kind[note.labels.get("kind", "?") or "?"] += unseen
            self.by_job[note.labels.get("job", "?") or "?"] += unseen
        self.decisions += len(note.new_ids)
        self.new_ids |= set(note.new_ids)

    @staticmethod
    def top(c: Counter[str]) -> tuple[list[tuple[str, int]], int]:
        """The TOP most common (name, count), and how many names are left out."""
        return c.most_common(TOP), max(0, len(c) - TOP)


class _Bucket:
    def __init__(self, per_min: float, now: float) -> None:
        self.rate, self.cap = per_min / 60.0, max(1.0, per_min)
        self.tokens, self.at = self.cap, now

    def take(self, now: float) -> bool:
        self.tokens = min(self.cap, self.tokens + (now - self.at) * self.rate)
        self.at = now
        if self.tokens >= 1.0:
            self.tokens -= 1.0
            return True
        return False

    def put_back(self) -> None:
        self.tokens = min(self.cap, self.tokens + 1.0)


class Limiter:
    """`admit(hook, note, now)`: post it (True) or counted into the hook's digest (False);
    `due_digests(now)`: the digests to send; `send_at(hook, now)`: when the next post to
    the hook may go; `sending(hook, now)` when one goes."""

    def __init__(self, limits: RateLimits, now: float) -> None:
        self.limits = limits
        self._total = _Bucket(limits.total_per_min, now)
        self._hooks: dict[str, _Bucket] = {}
        self._digests: dict[str, Digest] = {}
        self._next_slot: dict[str, float] = {}
        self.suppressed = 0  # notifications folded into digests, ever

    def admit(self, hook: str, note: Notification, now: float) -> bool:
        bucket = self._hooks.get(hook)
        if bucket is None:
            bucket = self._hooks[hook] = _Bucket(self.limits.per_webhook_per_min, now)
        if bucket.take(now):
            if self._total.take(now):
                return True
            bucket.put_back()
        dg = self._digests.get(hook)
        if dg is None:
            dg = self._digests[hook] = Digest(since=now)
        dg.add(note)
        self.suppressed += 1
        return False

    def pending(self, hook: str) -> Digest | None:
        return self._digests.get(hook)

    def due_digests(self, now: float) -> list[tuple[str, Digest]]:
        out = []
        for hook, dg in list(self._digests.items()):
            if now - dg.since >= self.limits.digest_interval_s:
                dg.now = now
                out.append((hook, dg))
                del self._digests[hook]
        return out

    def next_digest_at(self) -> float | None:
        return min((d.since + self.limits.digest_interval_s for d in self._digests.values()),
                   default=None)

    def send_at(self, hook: str, now: float) -> float:
        """When the next post to `hook` may start (not before `min_gap_s` after the last)."""
        return max(now, self._next_slot.get(hook, now))

    def sending(self, hook: str, now: float) -> None:
        """A post to `hook` starts now."""
        self._next_slot[hook] = now + self.limits.min_gap_s


@dataclass(frozen=True)
class RetryPolicy:
    """How often and how patiently a failed post is tried again."""

    attempts: int = 6
    base_s: float = 1.0
    factor: float = 2.0
    max_s: float = 60.0
    timeout_s: float = 10.0

    def delay_s(self, failures: int, retry_after_s: float | None = None) -> float:
        """Wait before try number failures+1: base * factor^(failures-1), capped; a server's
        Retry-After wins when it is longer (still capped)."""
        delay = min(self.max_s, self.base_s * self.factor ** max(0, failures - 1))
        if retry_after_s is not None:
            delay = min(self.max_s, max(delay, retry_after_s))
        return delay
