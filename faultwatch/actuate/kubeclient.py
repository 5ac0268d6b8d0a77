"""The Kubernetes API through kr8s: kubeconfig (contexts, client certificates, tokens, exec
credential plugins) or the in-cluster service account, as one blocking `request`."""

from __future__ import annotations

import asyncio
import json
import threading
import warnings
from collections.abc import Coroutine
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from faultwatch.actuate.backend import ActuateError
from faultwatch.errors import ConfigError

INSTALL_HINT = "pip install 'faultwatch[kubernetes]'"
API_PREFIX = "/api/v1/"
# the API server's answers that a retry cannot change: bad request, unauthenticated,
# forbidden (RBAC), not found, not allowed, invalid
PERMANENT_STATUS = (400, 401, 403, 404, 405, 422)


@dataclass(frozen=True)
class KubeConfig:
    """Where the API server is and who we are: kubectl's order, i.e. `kubeconfig`, else
    $KUBECONFIG (a `:`-separated list, merged), else ~/.kube/config, else the in-cluster
    service account; `context` else the file's current-context."""

    kubeconfig: Path | None = None
    context: str | None = None
    timeout_s: float = 30.0

    def __post_init__(self) -> None:
        if self.kubeconfig is not None and not self.kubeconfig.is_file():
            raise ConfigError("--kubeconfig", f"{self.kubeconfig}: no such file")
        if not self.timeout_s > 0:
            raise ConfigError("kubernetes", "timeout_s must be > 0")


class ApiStatus(ActuateError):
    """An API answer other than success; 401, 403, 404 and 422 will not change on a retry."""

    def __init__(self, code: int, method: str, path: str, detail: str) -> None:
        self.code = code
        self.detail = detail
        hint = ""
        if code == 403:
            hint = " (RBAC: see deploy/kubernetes/actuate-rbac.yaml for the verbs needed)"
        super().__init__(f"kubernetes: {method} {path} -> {code}: {detail}{hint}",
                         permanent=code in PERMANENT_STATUS)


_LOOP: asyncio.AbstractEventLoop | None = None
_LOOP_LOCK = threading.Lock()


def _loop() -> asyncio.AbstractEventLoop:
    """The event loop every KubeClient of this process runs on, in its own daemon thread."""
    global _LOOP
    with _LOOP_LOCK:
        if _LOOP is None:
            _LOOP = asyncio.new_event_loop()
            threading.Thread(target=_LOOP.run_forever, name="faultwatch-kube",
                             daemon=True).start()
        return _LOOP


class KubeClient:
    """kr8s's asyncio client on one event loop thread, so the actuator's worker threads call
    it blocking. kr8s reads the kubeconfig, runs exec plugins (again when the
    server answers 401: expired credentials), and keeps one connection pool."""

    def __init__(self, cfg: KubeConfig) -> None:
        try:
            import kr8s.asyncio  # noqa: F401 - the extra's presence, checked at start
        except ImportError:
            raise ConfigError("--backend kubernetes", "needs the Kubernetes client library "
                                                      f"kr8s: {INSTALL_HINT}") from None
        self.cfg = cfg
        self._api: Any = None

    def _run(self, coro: Coroutine[Any, Any, Any]) -> Any:
        fut = asyncio.run_coroutine_threadsafe(coro, _loop())
        try:  # an exec plugin may take a while: a bound well past the request's own
            return fut.result(timeout=self.cfg.timeout_s * 4)
        except TimeoutError:
            fut.cancel()
            raise ActuateError(f"kubernetes: no answer within {self.cfg.timeout_s * 4:.0f} s"
                               ) from None

    def connect(self) -> str:
        """Load the credentials (kubeconfig, exec plugin) and ask the server its version;
        a kubeconfig that names no usable context or user is a ConfigError."""
        return str(self._run(self._version()))

    async def _connected(self) -> Any:
        if self._api is None:
            import kr8s.asyncio

            with warnings.catch_warnings():  # kr8s warns of servers newer than it was tested
                warnings.filterwarnings("ignore", message="Kubernetes version")
                try:
                    api = await kr8s.asyncio.api(
                        kubeconfig=str(self.cfg.kubeconfig) if self.cfg.kubeconfig else None,
                        context=self.cfg.context)
                except (ValueError, KeyError) as e:  # no such context/user, no credentials
                    raise ConfigError("--kubeconfig", f"kubernetes: {e}") from None
                except Exception as e:  # noqa: BLE001 - translated once, here
                    raise _translate(e, "GET", "/version") from None
            api.timeout = self.cfg.timeout_s
            self._api = api
        return self._api

    async def _version(self) -> str:
        api = await self._connected()
        return str((await api.version()).get("gitVersion", "?"))

    def request(self, method: str, path: str, body: Any = None,
                content_type: str = "application/json", ok404: bool = False
                ) -> dict[str, Any] | None:
        """One call to a core/v1 path (`/api/v1/...`, query included); its JSON object, None
        for a 404 when `ok404`; ApiStatus for an error answer, ActuateError for no answer."""
        if not path.startswith(API_PREFIX):
            raise ValueError(f"not a core/v1 path: {path}")
        out: dict[str, Any] | None = self._run(self._request(method, path, body, content_type,
                                                             ok404))
        return out

    async def _request(self, method: str, path: str, body: Any, content_type: str,
                       ok404: bool) -> dict[str, Any] | None:
        api = await self._connected()
        kw: dict[str, Any] = {"headers": {"Accept": "application/json"}}
        if body is not None:
            kw["content"] = json.dumps(body).encode()
            kw["headers"]["Content-Type"] = content_type
        try:
            async with api.call_api(method, version="v1", base="/api",
                                    url=path[len(API_PREFIX):], **kw) as resp:
                raw = resp.content
        except Exception as e:  # noqa: BLE001 - translated once, here
            err = _translate(e, method, path)
            if ok404 and isinstance(err, ApiStatus) and err.code == 404:
                return None
            raise err from None
        if not raw:
            return {}
        try:
            out = json.loads(raw)
        except ValueError:
            raise ActuateError(f"kubernetes: {method} {path}: response is not JSON") from None
        return out if isinstance(out, dict) else {}


def _translate(e: BaseException, method: str, path: str) -> ActuateError:
    """kr8s's and httpx's errors as ours: an answer's status code, or no answer."""
    response = getattr(e, "response", None)
    code = getattr(response, "status_code", None)
    if isinstance(code, int):
        status = getattr(e, "status", None)
        detail = status.get("message") if isinstance(status, dict) else None
        return ApiStatus(code, method, path, str(detail or e)[:300])
    return ActuateError(f"kubernetes: {method} {path} failed: {type(e).__name__}: "
                        f"{str(e)[:300]}")
