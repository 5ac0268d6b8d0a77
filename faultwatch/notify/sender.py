"""Posting one notification to one webhook (notify/http.py), with retries and exponential
backoff that honours Retry-After."""

from __future__ import annotations

import asyncio
import re
import urllib.parse
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import httpx2
import orjson

from faultwatch.errors import ConfigError
from faultwatch.notify import formats, http
from faultwatch.notify.grouping import Notification
from faultwatch.notify.http import Outcome
from faultwatch.notify.limit import Digest, RetryPolicy  # noqa: F401 - re-exported

Log = Callable[..., None]


@dataclass(frozen=True)
class Receiver:
    """A webhook: where, in which format, and the bot's signing secret (Feishu, DingTalk)."""

    url: str = field(repr=False)
    fmt: str = "json"
    secret: str | None = field(default=None, repr=False)

    def __post_init__(self) -> None:
        if self.fmt not in formats.FORMATS:
            raise ConfigError("webhook", f"unknown format {self.fmt!r}; choose from "
                                         f"{', '.join(formats.FORMATS)}")
        if not self.url.startswith(("http://", "https://")):
            raise ConfigError("webhook", f"{self.url[:8]!r}... is not an http(s) URL (a "
                                         "webhook is [FORMAT=]http(s)://...)")

    @classmethod
    def parse(cls, spec: str, secret: str | None = None) -> Receiver:
        """`[FORMAT=]URL`, e.g. `slack=https://hooks.slack.com/services/...`."""
        fmt, sep, url = spec.partition("=")
        if sep and fmt in formats.FORMATS:
            return cls(url, fmt, secret)
        return cls(spec, "json", secret)

    @property
    def where(self) -> str:
        """The URL as logs show it: scheme and host only (Slack, Feishu and DingTalk keep
        the webhook's secret in the path or the query)."""
        return redact(self.url)


def redact(url: str) -> str:
    """`https://hooks.slack.com/services/T/B/x` -> `https://hooks.slack.com`."""
    parts = urllib.parse.urlsplit(url)
    host = parts.hostname or "?"
    if ":" in host:
        host = f"[{host}]"
    port = f":{parts.port}" if parts.port else ""
    return f"{parts.scheme}://{host}{port}"


# where the webhooks of the common chat services keep their token (their documented URL forms):
# Slack; Feishu/Lark; Discord; Mattermost, Rocket.Chat and Zapier; Microsoft Teams connectors
_TOKEN_PATHS = ("/services/", "/hook/", "/webhooks/", "/hooks/", "/webhookb2/",
                "/incomingwebhook/")
_TOKEN_QUERY = frozenset({"access_token", "token", "key", "secret", "sig", "signature",
                          "code", "auth", "apikey", "api_key", "sp", "sv"})
_TOKENISH = re.compile(r"[A-Za-z0-9_\-.~+=:%@]{16,}")  # a path segment or query value
TELEGRAM_BOT = re.compile(r"/bot\d+:[^/]+")  # api.telegram.org/bot<id>:<token>/sendMessage


def _tokenish(part: str) -> bool:
    """The general case: a long random-looking value (letters and digits mixed, or 32+
    characters of a token alphabet), e.g. Mattermost's 26-character key, a UUID, a JWT."""
    if not _TOKENISH.fullmatch(part):
        return False
    return len(part) >= 32 or (any(c.isdigit() for c in part) and any(c.isalpha()
                                                                       for c in part))


def holds_token(spec: str) -> str | None:
    """What in a webhook's URL is a credential, or None: a Slack `services/T/B/x`, Feishu
    `hook/<id>`, Discord `webhooks/`, Mattermost/Rocket.Chat `hooks/<key>`, Teams
    `webhookb2/...` or Telegram `bot<id>:<token>` path; a DingTalk `access_token`, WeCom `key`
    or Power Automate `sig` query; a user or password in the address; and in general any path
    segment or query value that looks like a token (16+ characters mixing letters and
    digits, or 32+ of a token alphabet). Such URLs belong in a file or the environment,
    never on a command line that `ps` shows everyone. The answer names where, not what."""
    parts = urllib.parse.urlsplit(Receiver.parse(spec).url)
    query = urllib.parse.parse_qsl(parts.query, keep_blank_values=True)
    hit = sorted({k.lower() for k, _ in query} & _TOKEN_QUERY)
    if hit:  # DingTalk access_token, WeCom key, ...
        return f"the query parameter {hit[0]!r}"
    path = parts.path.lower()
    for p in _TOKEN_PATHS:
        if p in path and path.split(p, 1)[1].strip("/"):
            return f"the path after {p!r}"
    if TELEGRAM_BOT.search(parts.path):
        return "the bot token in the path"
    if parts.password:
        return "the password in the address"
    if parts.username:
        return "the user name in the address"
    if any(_tokenish(urllib.parse.unquote(seg)) for seg in parts.path.split("/")):
        return "a path segment that looks like a token"
    for k, v in query:
        if _tokenish(v):
            return f"the value of query parameter {k[:40]!r}, which looks like a token"
    return None


async def post_once(client: httpx2.AsyncClient, receiver: Receiver,
                    note: Notification | Digest) -> Outcome:
    """One POST of the note's body in the receiver's format; never raises for network
    trouble. Feishu and DingTalk answer 200 with an error code when they refuse."""
    data = orjson.dumps(formats.body(receiver.fmt, note, receiver.secret))
    url = formats.dingtalk_url(receiver.url, receiver.secret) if receiver.fmt == "dingtalk" \
        else receiver.url
    out = await http.post(client, url, data, receiver.where)
    if not out.accepted:
        return out
    try:
        answer: Any = orjson.loads(out.answer) if out.answer else None
    except orjson.JSONDecodeError:
        answer = None
    if formats.accepted(receiver.fmt, out.status, answer):
        return out
    return Outcome(out.status, False, False, f"refused: {out.answer[:300]!r}")


async def deliver(client: httpx2.AsyncClient, receiver: Receiver, note: Notification | Digest,
                  retry: RetryPolicy, log: Log,
                  sleep: Callable[[float], Awaitable[Any]] = asyncio.sleep) -> bool:
    """Post until accepted, retrying network errors, 5xx, 408 and 429 with backoff."""
    for attempt in range(1, retry.attempts + 1):
        out = await post_once(client, receiver, note)
        if out.accepted:
            log("notification_sent", group=note.key, reason=note.reason, firing=note.firing,
                new=len(note.new_ids), webhook=receiver.where, format=receiver.fmt,
                attempt=attempt)
            return True
        if not out.retry or attempt == retry.attempts:
            log("notification_failed", group=note.key, webhook=receiver.where,
                status=out.status, detail=out.detail, attempts=attempt)
            return False
        delay = retry.delay_s(attempt, out.retry_after_s)
        log("notification_retry", group=note.key, webhook=receiver.where, status=out.status,
            detail=out.detail, attempt=attempt, retry_in_s=round(delay, 2))
        await sleep(delay)
    return False
