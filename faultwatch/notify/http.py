"""notify's HTTP: a pooled httpx2 client per receiver, TLS and credentials from files, and one
POST as an Outcome that says whether to retry (network trouble never raises)."""

from __future__ import annotations

import ssl
import time
from dataclasses import dataclass
from email.utils import parsedate_to_datetime
from pathlib import Path
from typing import Any

import httpx2

from faultwatch.errors import ConfigError

USER_AGENT = "faultwatch-notify"
MAX_ANSWER_BYTES = 65536


@dataclass(frozen=True)
class Outcome:
    """The answer to one post: status (0 when nothing answered), and whether to retry."""

    status: int
    accepted: bool
    retry: bool
    detail: str = ""
    retry_after_s: float | None = None
    answer: bytes = b""


def _read(path: Path, what: str) -> str:
    try:
        return path.read_text().strip()
    except OSError as e:
        raise ConfigError(str(path), f"cannot read the {what}: {e.strerror}") from None


@dataclass(frozen=True)
class HttpSecurity:
    """TLS and credentials of a receiver, each from a file (never on the command line): a CA
    bundle, a client certificate and key, and basic auth (`user:password` on one line) or a
    bearer token (read again for every post: tokens rotate)."""

    ca_file: Path | None = None
    cert_file: Path | None = None
    key_file: Path | None = None
    basic_auth_file: Path | None = None
    bearer_token_file: Path | None = None

    def __post_init__(self) -> None:
        if self.basic_auth_file and self.bearer_token_file:
            raise ConfigError("notify", "basic auth or a bearer token, not both")
        if self.key_file and not self.cert_file:
            raise ConfigError("notify", "a client key needs its certificate file")
        if self.basic_auth_file and ":" not in _read(self.basic_auth_file, "basic auth"):
            raise ConfigError(str(self.basic_auth_file), "basic auth is `user:password`")
        if self.bearer_token_file:
            _read(self.bearer_token_file, "bearer token")

    def client(self, timeout_s: float) -> httpx2.AsyncClient:
        verify: ssl.SSLContext | bool = True
        if self.ca_file or self.cert_file:
            try:
                ctx = ssl.create_default_context(
                    cafile=str(self.ca_file) if self.ca_file else None)
                if self.cert_file:
                    ctx.load_cert_chain(str(self.cert_file),
                                        str(self.key_file) if self.key_file else None)
            except (OSError, ssl.SSLError) as e:
                raise ConfigError("notify", f"TLS files: {e}") from None
            verify = ctx
        auth: Any = None
        if self.basic_auth_file:
            user, _, password = _read(self.basic_auth_file, "basic auth").partition(":")
            auth = httpx2.BasicAuth(user, password)
        return httpx2.AsyncClient(verify=verify, auth=auth, timeout=httpx2.Timeout(timeout_s),
                                  follow_redirects=False,
                                  headers={"User-Agent": USER_AGENT})

    def headers(self) -> dict[str, str]:
        if self.bearer_token_file:
            return {"Authorization": f"Bearer {_read(self.bearer_token_file, 'bearer token')}"}
        return {}


def retry_after(value: str | None) -> float | None:
    """A Retry-After header in seconds (delta-seconds or an HTTP date), or None."""
    if not value:
        return None
    try:
        return max(0.0, float(value))
    except ValueError:
        pass
    try:
        return max(0.0, parsedate_to_datetime(value).timestamp() - time.time())
    except (TypeError, ValueError):
        return None


async def post(client: httpx2.AsyncClient, url: str, data: bytes, where: str,
               headers: dict[str, str] | None = None) -> Outcome:
    """One POST of a JSON body. `accepted` means a 2xx; network errors, 5xx, 408 and 429 are
    to be retried, other answers are not. Errors name `where`, never the URL (it may hold a
    token)."""
    try:
        resp = await client.post(url, content=data, headers={
            "Content-Type": "application/json", **(headers or {})})
        raw = resp.content[:MAX_ANSWER_BYTES]
    except httpx2.HTTPError as e:
        detail = f"{type(e).__name__}: {str(e).replace(url, where)}"[:300]
        return Outcome(0, False, True, detail)
    status = resp.status_code
    if 200 <= status < 300:
        return Outcome(status, True, False, answer=raw)
    retry = status >= 500 or status in (408, 429)
    return Outcome(status, False, retry, f"HTTP {status} {resp.reason_phrase}: {raw[:200]!r}",
                   retry_after(resp.headers.get("Retry-After")), raw)
