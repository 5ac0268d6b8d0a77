"""A real Alertmanager for tests (Debian's prometheus-alertmanager; scripts/bootstrap.sh
installs it): deploy/alertmanager/alertmanager.yml with its timers shortened and every
receiver pointed at a local webhook, on free loopback ports, clustering off."""

from __future__ import annotations

import copy
import json
import shutil
import subprocess
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any

import yaml

from faultwatch.kafka import broker as kafka_broker
from tests.support.waiting import wait_until

REPO = Path(__file__).resolve().parents[2]
CONFIG = REPO / "deploy" / "alertmanager" / "alertmanager.yml"
EXE = "prometheus-alertmanager"


def missing() -> str | None:
    if shutil.which(EXE) is None:
        return f"{EXE} is missing (scripts/bootstrap.sh installs Debian's package)"
    return None


def _shorten(route: dict[str, Any]) -> None:
    for key in ("group_wait", "group_interval"):
        if key in route:
            route[key] = "1s"
    for sub in route.get("routes", []):
        _shorten(sub)


def routed_config(hook_url: str) -> dict[str, Any]:
    """deploy/'s routes and inhibitions as shipped, timers 1 s, receivers -> the hook."""
    cfg = copy.deepcopy(yaml.safe_load(CONFIG.read_text()))
    route = cfg["route"]
    route["group_wait"] = route["group_interval"] = "1s"
    _shorten(route)
    cfg["receivers"] = [{"name": r["name"], "webhook_configs": [
        {"url": hook_url, "send_resolved": True}]}
        for r in cfg["receivers"]]
    return cfg


class Alertmanager:
    """One Alertmanager process and its v2 API."""

    def __init__(self, tmp: Path, hook_url: str) -> None:
        port = kafka_broker.free_port()
        self.url = f"http://{kafka_broker.HOST}:{port}"
        (tmp / "alertmanager.yml").write_text(json.dumps(routed_config(hook_url)))
        self.log = tmp / "alertmanager.log"
        with open(self.log, "wb") as fh:
            self.proc = subprocess.Popen(
                [EXE, f"--config.file={tmp / 'alertmanager.yml'}",
                 f"--storage.path={tmp / 'data'}",
                 f"--web.listen-address={kafka_broker.HOST}:{port}",
                 "--cluster.listen-address=", "--log.level=info"],
                stdout=fh, stderr=subprocess.STDOUT)
        wait_until(self._ready, 60, "Alertmanager to answer /-/ready",
                   detail=lambda: self.log.read_text()[-2000:])

    def _ready(self) -> bool:
        assert self.proc.poll() is None, self.log.read_text()[-2000:]
        try:
            with urllib.request.urlopen(self.url + "/-/ready", timeout=5) as r:
                return r.status == 200
        except OSError:
            return False

    def api(self, path: str, body: Any = None, **query: str) -> Any:
        url = f"{self.url}/api/v2/{path}"
        if query:
            url += "?" + urllib.parse.urlencode(query)
        data = None if body is None else json.dumps(body).encode()
        req = urllib.request.Request(url, data=data, method="POST" if data else "GET",
                                     headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=10) as r:
            raw = r.read()
        return json.loads(raw) if raw else None

    def alerts(self, job: str) -> list[dict[str, Any]]:
        """The job's alerts Alertmanager holds (active, silenced or inhibited; not resolved)."""
        return list(self.api("alerts", filter=f'job="{job}"'))

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(20)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(5)
