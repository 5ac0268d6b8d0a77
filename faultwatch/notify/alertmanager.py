"""Alertmanager receivers: alerts posted to its v2 API (`POST /api/v2/alerts`), every alert to
every Alertmanager given (the members of an HA cluster each need them, as Prometheus sends).

Each Alertmanager has one pooled client and one pending batch: what `submit` adds while a
post is in flight or being retried merges into that batch by fingerprint (the newer state of
an alert wins), so an Alertmanager that is down for long costs one batch, not a queue."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import httpx2
import orjson

from faultwatch.errors import ConfigError
from faultwatch.notify import http
from faultwatch.notify.alerts import Due, fingerprint
from faultwatch.notify.http import HttpSecurity
from faultwatch.notify.sender import RetryPolicy, redact

Log = Callable[..., None]
API_PATH = "/api/v2/alerts"
MAX_ALERTS_PER_POST = 1000


@dataclass(frozen=True)
class Alertmanager:
    """One Alertmanager: its base URL (`http(s)://host:9093`, with a path prefix if it is
    served under one)."""

    url: str = field(repr=False)

    def __post_init__(self) -> None:
        if not self.url.startswith(("http://", "https://")):
            raise ConfigError("alertmanager", f"{self.url[:8]!r}... is not an http(s) URL")

    @property
    def endpoint(self) -> str:
        base = self.url.rstrip("/")
        return base if base.endswith(API_PATH) else base + API_PATH

    @property
    def where(self) -> str:
        return redact(self.url)


@dataclass
class _Pending:
    alerts: dict[str, dict[str, Any]] = field(default_factory=dict)
    ids: set[str] = field(default_factory=set)


class AlertmanagerSender:
    """Posts submitted alerts to each Alertmanager; `on_done(ids)` is called once per
    Alertmanager and batch when the batch was accepted or given up on."""

    def __init__(self, targets: tuple[Alertmanager, ...], security: HttpSecurity,
                 retry: RetryPolicy, log: Log, on_done: Callable[[frozenset[str]], None]):
        self.targets, self.security, self.retry = targets, security, retry
        self.log, self.on_done = log, on_done
        self._pending = [_Pending() for _ in targets]
        self._wake = [asyncio.Event() for _ in targets]
        self._busy = [False for _ in targets]
        self._tasks: list[asyncio.Task[None]] = []
        self._client: httpx2.AsyncClient | None = None
        self.posted = 0  # alerts accepted, over all Alertmanagers

    def submit(self, due: Due) -> None:
        for i, pending in enumerate(self._pending):
            for alert in due.alerts:
                pending.alerts[fingerprint(alert["labels"])] = alert
            pending.ids |= due.ids
            self._wake[i].set()

    def idle(self) -> bool:
        return not any(self._busy) and not any(p.alerts for p in self._pending)

    def start(self) -> None:
        self._client = client = self.security.client(self.retry.timeout_s)
        self._tasks = [asyncio.create_task(self._run(i, client))
                       for i in range(len(self.targets))]

    async def stop(self, drain_s: float) -> None:
        """Let the pending batches go out (at most `drain_s`), then stop."""
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(drain_s):
                while not self.idle():
                    await asyncio.sleep(0.05)
        for t in self._tasks:
            t.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        if self._client is not None:
            await self._client.aclose()

    async def _run(self, i: int, client: httpx2.AsyncClient) -> None:
        while True:
            await self._wake[i].wait()
            self._wake[i].clear()
            batch, self._pending[i] = self._pending[i], _Pending()
            if not batch.alerts:
                continue
            self._busy[i] = True
            try:
                await self._post(i, client, list(batch.alerts.values()))
            finally:
                self._busy[i] = False
                self.on_done(frozenset(batch.ids))

    async def _post(self, i: int, client: httpx2.AsyncClient,
                    alerts: list[dict[str, Any]]) -> None:
        am = self.targets[i]
        for start in range(0, len(alerts), MAX_ALERTS_PER_POST):
            chunk = alerts[start:start + MAX_ALERTS_PER_POST]
            data = orjson.dumps(chunk)
            for attempt in range(1, self.retry.attempts + 1):
                out = await http.post(client, am.endpoint, data, am.where,
                                      self.security.headers())
                if out.accepted:
                    self.posted += len(chunk)
                    self.log("alerts_posted", alertmanager=am.where, alerts=len(chunk),
                             attempt=attempt)
                    break
                if not out.retry or attempt == self.retry.attempts:
                    self.log("alerts_failed", alertmanager=am.where, status=out.status,
                             detail=out.detail, alerts=len(chunk), attempts=attempt)
                    break
                delay = self.retry.delay_s(attempt, out.retry_after_s)
                self.log("alerts_retry", alertmanager=am.where, status=out.status,
                         detail=out.detail, attempt=attempt, retry_in_s=round(delay, 2))
                await asyncio.sleep(delay)

