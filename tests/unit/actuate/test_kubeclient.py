"""The Kubernetes client adapter without a server: what it refuses at start and how it
translates the library's errors (the real API server: tests/integration/test_kubernetes_api.py)."""

from __future__ import annotations

import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from faultwatch.actuate.backend import ActuateError
from faultwatch.actuate.kubeclient import ApiStatus, KubeClient, KubeConfig, _translate
from faultwatch.errors import ConfigError


def test_a_kubeconfig_that_is_not_there_is_refused_at_start(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="no such file"):
        KubeConfig(kubeconfig=tmp_path / "absent")
    (tmp_path / "config").write_text("apiVersion: v1\nkind: Config\n")
    assert KubeConfig(kubeconfig=tmp_path / "config").context is None  # the control


def test_without_the_extra_the_backend_says_how_to_install_it(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "kr8s.asyncio", None)  # import fails
    with pytest.raises(ConfigError, match=r"faultwatch\[kubernetes\]"):
        KubeClient(KubeConfig())


def test_answers_become_api_status_and_the_rest_no_answer() -> None:
    class ServerError(Exception):
        def __init__(self, code: int) -> None:
            super().__init__("boom")
            self.response = SimpleNamespace(status_code=code)
            self.status = {"message": f"pods is forbidden ({code})"}

    forbidden = _translate(ServerError(403), "GET", "/api/v1/pods")
    assert isinstance(forbidden, ApiStatus) and forbidden.permanent
    assert "forbidden (403)" in str(forbidden) and "actuate-rbac.yaml" in str(forbidden)
    busy = _translate(ServerError(429), "POST", "/api/v1/x/eviction")
    assert isinstance(busy, ApiStatus) and not busy.permanent
    down = _translate(ConnectionError("refused"), "GET", "/api/v1/nodes/n")
    assert type(down) is ActuateError and not down.permanent
    assert "ConnectionError: refused" in str(down)
