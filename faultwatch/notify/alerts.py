"""Decisions as Alertmanager alerts (pure, time passed in): labels that route, annotations
escaped and bounded, which alerts are open, when each is re-sent, and when it resolves.

An alert is identified by its labels (Alertmanager's fingerprint): alertname (by action),
job, node, action, kind, rule, category and severity. The same failure again in the next
attempt is the same alert, still firing; a different kind, rule or node of the same job is
another alert, which Alertmanager groups with it by its route's `group_by`.

Open alerts are posted again every `resend_s` with `endsAt` = now + 4 x resend_s (as
Prometheus does), so a notifier that stops lets them lapse instead of firing forever. An
alert resolves when the job is healthy again, as the status topic shows it: a later attempt
of its run (or a new run of the job) reports progress, or every node finished (`done`).
A `notify` decision resolves after `notice_open_s`; anything still open after `max_open_s`
resolves too (a failed job that nobody resubmits). A resolution is posted `RESOLVED_SENDS`
times, so an Alertmanager that restarted in between still learns it.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from faultwatch.notify import escape

ALERTNAMES = {"restart": "FaultwatchJobRestart", "blacklist": "FaultwatchNodeBlacklisted",
              "fail": "FaultwatchJobFailed", "notify": "FaultwatchNotice"}
SEVERITY = {"fail": "critical", "blacklist": "warning", "restart": "warning",
            "notify": "info"}
LABELS = ("alertname", "job", "node", "action", "kind", "rule", "category", "severity")
MAX_LABEL_CHARS = 128
MAX_LINE_CHARS = 300
MAX_NODES_SHOWN = 8
RESOLVED_SENDS = 3
TTL_RESENDS = 4  # endsAt of a firing alert: this many resend intervals ahead


def bounded(value: object, limit: int) -> str:
    """One line of text (no control or bidi-override characters), at most `limit` chars."""
    s = escape.plain(value).strip()
    return s if len(s) <= limit else s[:limit - 1] + "\u2026"


def rfc3339(ts: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(ts)) + f".{int(ts % 1 * 1000):03d}Z"


def _get(d: Mapping[str, Any], key: str) -> dict[str, Any]:
    v = d.get(key)
    return v if isinstance(v, dict) else {}


def labels_of(d: Mapping[str, Any]) -> dict[str, str]:
    """The routing labels of a decision dict (empty ones left out, as Alertmanager does)."""
    reason, first = _get(d, "reason"), _get(_get(d, "evidence"), "first_error")
    nodes = [str(n) for n in (_get(d, "targets").get("nodes") or [])]
    node = first.get("node") or (nodes[0] if len(nodes) == 1 else "")
    action = str(d.get("action") or "")
    out = {"alertname": ALERTNAMES.get(action, "FaultwatchDecision"), "job": d.get("job"),
           "node": node, "action": action, "kind": reason.get("kind"),
           "rule": reason.get("rule"), "category": reason.get("category"),
           "severity": SEVERITY.get(action, "warning")}
    return {k: bounded(v, MAX_LABEL_CHARS) for k, v in out.items() if v not in (None, "")}


def annotations_of(d: Mapping[str, Any]) -> dict[str, str]:
    """summary, the reason, the first error line, the nodes, where to look: bounded, and
    inert in every sink Alertmanager relays them to (no mention, link or markup: escape.text,
    which leaves them readable in Slack, e-mail and PagerDuty alike)."""
    reason, first = _get(d, "reason"), _get(_get(d, "evidence"), "first_error")
    job, attempt = bounded(d.get("job"), MAX_LABEL_CHARS), d.get("attempt")
    nodes = [str(n) for n in (_get(d, "targets").get("nodes") or [])]
    shown = ",".join(nodes[:MAX_NODES_SHOWN]) + (f" (+{len(nodes) - MAX_NODES_SHOWN})"
                                                 if len(nodes) > MAX_NODES_SHOWN else "")
    out = {"summary": f"{d.get('action')} of job {job} (attempt {attempt}): "
                      f"{reason.get('kind')} {reason.get('rule') or ''}".strip(),
           "description": reason.get("message") or "",
           "first_error": first.get("line") or "",
           "first_error_where": " ".join(f"{k} {first[k]}" for k in ("node", "rank")
                                         if first.get(k) is not None),
           "nodes": shown, "attempt": attempt, "run_id": d.get("run_id") or "",
           "decision": d.get("id"),
           "logs": f"faultwatch logs {job} --attempt {attempt}"}
    return {k: bounded(escape.text(v), MAX_LINE_CHARS) for k, v in out.items()
            if v not in (None, "")}


def fingerprint(labels: Mapping[str, str]) -> str:
    return "\x1f".join(f"{k}={labels[k]}" for k in LABELS if k in labels)


@dataclass(frozen=True)
class AlertPolicy:
    """How long alerts stay open and how often they are re-sent, in seconds."""

    resend_s: float = 60.0
    notice_open_s: float = 300.0  # a `notify` decision's alert resolves after this
    max_open_s: float = 12 * 3600.0  # anything open this long resolves
    max_open: int = 10_000  # alerts held open at once; beyond it the oldest lapse

    def __post_init__(self) -> None:
        if not self.resend_s > 0:
            raise ValueError("resend_s must be > 0")
        for name in ("notice_open_s", "max_open_s"):
            if not getattr(self, name) >= 0:
                raise ValueError(f"{name} must be >= 0")
        if self.max_open < 1:
            raise ValueError("max_open must be >= 1")


@dataclass
class Alert:
    """One open (or recently resolved) alert."""

    labels: dict[str, str]
    annotations: dict[str, str]
    starts_at: float  # the first decision's time
    job: str
    run_id: str
    attempt: int
    last_ts: float  # the newest decision's time
    opened_at: float  # now-clock
    expire_at: float  # now-clock: resolves by itself then
    send_at: float = 0.0
    ends_at: float | None = None  # set when resolved
    resolved_sends: int = 0
    ids: set[str] = field(default_factory=set)  # decisions not yet posted

    def body(self, now: float, ttl_s: float) -> dict[str, Any]:
        ends = self.ends_at if self.ends_at is not None else now + ttl_s
        return {"labels": self.labels, "annotations": self.annotations,
                "startsAt": rfc3339(self.starts_at), "endsAt": rfc3339(ends)}


@dataclass(frozen=True)
class Due:
    """What to post now: Alertmanager's JSON alerts, and the decision ids they carry."""

    alerts: list[dict[str, Any]]
    ids: frozenset[str]


class AlertBook:
    """The open alerts; `add` a decision, `observe` a status snapshot, `due(now)` to post."""

    def __init__(self, policy: AlertPolicy) -> None:
        self.policy = policy
        self.alerts: dict[str, Alert] = {}
        self._by_job: dict[str, set[str]] = {}
        self._snaps: OrderedDict[str, Mapping[str, Any]] = OrderedDict()  # job -> newest
        self.dropped = 0  # alerts let lapse because max_open were open

    def add(self, d: Mapping[str, Any], now: float) -> str:
        labels = labels_of(d)
        key = fingerprint(labels)
        ts, attempt = float(d.get("ts") or now), int(d.get("attempt") or 0)
        life = self.policy.notice_open_s if d.get("action") == "notify" \
            else self.policy.max_open_s
        a = self.alerts.get(key)
        if a is None or a.ends_at is not None:  # new, or firing again after it resolved
            if a is None and len(self.alerts) >= self.policy.max_open:
                self._forget(min(self.alerts, key=lambda k: self.alerts[k].opened_at))
                self.dropped += 1
            a = Alert(labels, annotations_of(d), ts, str(d.get("job")),
                      str(d.get("run_id") or ""), attempt, ts, now, now + life)
            self.alerts[key] = a
            self._by_job.setdefault(a.job, set()).add(key)
        elif ts >= a.last_ts:  # the same alert again: the newest decision describes it
            a.annotations, a.run_id, a.attempt, a.last_ts = annotations_of(d), \
                str(d.get("run_id") or ""), attempt, ts
            a.expire_at = max(a.expire_at, now + life)
        a.ids.add(str(d.get("id")))
        a.send_at = now  # post at once
        snap = self._snaps.get(a.job)  # read before the decision (the topics race)
        if snap is not None and a.ends_at is None and healthy(a, snap):
            self._resolve(a, now)
        return key

    def observe(self, snap: Mapping[str, Any], now: float) -> list[str]:
        """Resolve the job's alerts that this status snapshot shows healthy again."""
        job = str(snap.get("job"))
        self._snaps[job] = snap
        self._snaps.move_to_end(job)
        while len(self._snaps) > self.policy.max_open:
            self._snaps.popitem(last=False)
        done = []
        for key in sorted(self._by_job.get(job, ())):
            a = self.alerts[key]
            if a.ends_at is None and healthy(a, snap):
                self._resolve(a, now)
                done.append(key)
        return done

    def _resolve(self, a: Alert, now: float) -> None:
        a.ends_at, a.send_at, a.resolved_sends = max(now, a.starts_at), now, 0

    def _forget(self, key: str) -> None:
        a = self.alerts.pop(key)
        keys = self._by_job.get(a.job, set())
        keys.discard(key)
        if not keys:
            self._by_job.pop(a.job, None)

    def due(self, now: float) -> Due:
        """The alerts to post now (new, changed, re-sends, resolutions); marks them sent."""
        ttl = TTL_RESENDS * self.policy.resend_s
        out, ids = [], set()
        for key, a in list(self.alerts.items()):
            if a.ends_at is None and now >= a.expire_at:
                self._resolve(a, now)
            if now < a.send_at:
                continue
            out.append(a.body(now, ttl))
            ids |= a.ids
            a.ids = set()
            a.send_at = now + self.policy.resend_s
            if a.ends_at is not None:
                a.resolved_sends += 1
                if a.resolved_sends >= RESOLVED_SENDS:
                    self._forget(key)
        return Due(out, frozenset(ids))

    def next_due(self) -> float | None:
        return min((min(a.send_at, a.expire_at) for a in self.alerts.values()), default=None)

    def firing(self) -> int:
        return sum(1 for a in self.alerts.values() if a.ends_at is None)


def healthy(a: Alert, snap: Mapping[str, Any]) -> bool:
    """Whether a status snapshot shows the alert's job healthy after the alert's decision:
    every node finished, or a later attempt of its run (or another run) made progress."""
    try:
        ts, attempt, steps = float(snap["ts"]), int(snap["attempt"]), int(snap.get("steps") or 0)
    except (KeyError, TypeError, ValueError):
        return False
    if ts < a.last_ts:  # older than the decision
        return False
    if snap.get("phase") == "done":
        return True
    run_id = str(snap.get("run_id") or "")
    later = attempt > a.attempt if run_id == a.run_id else True
    return later and steps > 0
