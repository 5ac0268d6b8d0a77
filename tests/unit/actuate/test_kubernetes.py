"""Kubernetes actuator against a local HTTPS server that speaks the API paths it uses:
the exact requests (method, path, bearer token, content type, body) are asserted."""

from __future__ import annotations

import json
import shutil
import ssl
import subprocess
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from faultwatch.actuate.backend import ActuateError
from faultwatch.actuate.kubernetes import TAINT_KEY, KubeConfig, KubernetesBackend
from faultwatch.actuate.plan import QUARANTINE, RELEASE, REQUEUE, Action

TOKEN = "s3cr3t-token"


class FakeAPI:
    """Nodes and pods in memory; records every request."""

    def __init__(self) -> None:
        self.requests: list[dict[str, Any]] = []
        self.nodes: dict[str, dict[str, Any]] = {
            "gpu-1": {"metadata": {"name": "gpu-1", "resourceVersion": "7"},
                      "spec": {"taints": [{"key": "other", "effect": "NoExecute"}]}}}
        self.pods: dict[tuple[str, str], dict[str, Any]] = {
            ("ml", "train-worker-0"): {"metadata": {"name": "train-worker-0", "uid": "u-1",
                                                    "labels": {"job": "train"}},
                                       "spec": {"nodeName": "gpu-1"}},
            ("ml", "train-worker-1"): {"metadata": {"name": "train-worker-1", "uid": "u-2",
                                                    "labels": {"job": "train"}},
                                       "spec": {"nodeName": "gpu-1"}},
            ("ml", "train-worker-2"): {"metadata": {"name": "train-worker-2", "uid": "u-3",
                                                    "labels": {"job": "train"}},
                                       "spec": {"nodeName": "gpu-2"}}}
        self.conflicts = 0  # answer the next N node PATCHes with 409


def _handler(api: FakeAPI) -> type[BaseHTTPRequestHandler]:
    class H(BaseHTTPRequestHandler):
        def log_message(self, *a: Any) -> None:
            pass

        def _reply(self, code: int, obj: Any) -> None:
            raw = json.dumps(obj).encode()
            self.send_response(code)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(raw)))
            self.end_headers()
            self.wfile.write(raw)

        def _handle(self) -> None:
            n = int(self.headers.get("Content-Length") or 0)
            body = json.loads(self.rfile.read(n)) if n else None
            api.requests.append({"method": self.command, "path": self.path,
                                 "auth": self.headers.get("Authorization"),
                                 "ctype": self.headers.get("Content-Type"), "body": body})
            if self.headers.get("Authorization") != f"Bearer {TOKEN}":
                return self._reply(401, {"reason": "Unauthorized"})
            parts = self.path.split("?")[0].strip("/").split("/")
            if parts[:3] == ["api", "v1", "nodes"] and len(parts) == 4:
                node = api.nodes.get(parts[3])
                if node is None:
                    return self._reply(404, {"reason": "NotFound"})
                if self.command == "GET":
                    return self._reply(200, node)
                if self.command == "PATCH":
                    if api.conflicts:
                        api.conflicts -= 1
                        node["metadata"]["resourceVersion"] = str(
                            int(node["metadata"]["resourceVersion"]) + 1)
                        return self._reply(409, {"reason": "Conflict"})
                    if body["metadata"]["resourceVersion"] != node["metadata"]["resourceVersion"]:
                        return self._reply(409, {"reason": "Conflict"})
                    node["spec"]["taints"] = body["spec"]["taints"]
                    node["metadata"]["resourceVersion"] = str(
                        int(node["metadata"]["resourceVersion"]) + 1)
                    return self._reply(200, node)
            if parts[:3] == ["api", "v1", "namespaces"] and parts[4:5] == ["pods"]:
                ns = parts[3]
                if len(parts) == 5 and self.command == "GET":
                    from urllib.parse import parse_qs, urlparse
                    q = parse_qs(urlparse(self.path).query)
                    lk, lv = q["labelSelector"][0].split("=")
                    fnode = q["fieldSelector"][0].split("=")[1]
                    items = [p for (pns, _), p in api.pods.items() if pns == ns
                             and p["metadata"]["labels"].get(lk) == lv
                             and p["spec"]["nodeName"] == fnode]
                    return self._reply(200, {"items": items})
                pod = api.pods.get((ns, parts[5])) if len(parts) == 6 else None
                if pod is None:
                    return self._reply(404, {"reason": "NotFound"})
                if self.command == "GET":
                    return self._reply(200, pod)
                if self.command == "DELETE":
                    if body["preconditions"].get("uid") != pod["metadata"]["uid"]:
                        return self._reply(409, {"reason": "Conflict"})
                    del api.pods[(ns, parts[5])]
                    return self._reply(200, {"status": "Success"})
            self._reply(404, {"reason": "NotFound"})

        do_GET = do_PATCH = do_DELETE = _handle

    return H


@pytest.fixture(scope="module")
def cert_key(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    if shutil.which("openssl") is None:
        pytest.fail("openssl is needed to make the test server's certificate")
    d = tmp_path_factory.mktemp("tls")
    cert, key = d / "ca.crt", d / "key.pem"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1",
                    "-subj", "/CN=127.0.0.1", "-addext", "subjectAltName=IP:127.0.0.1",
                    "-keyout", str(key), "-out", str(cert)], check=True, capture_output=True)
    return cert, key


@pytest.fixture()
def api(tmp_path: Path, cert_key: tuple[Path, Path]) -> Iterator[tuple[FakeAPI, KubeConfig]]:
    cert, key = cert_key
    token = tmp_path / "token"
    token.write_text(TOKEN + "\n")
    fake = FakeAPI()
    srv = ThreadingHTTPServer(("127.0.0.1", 0), _handler(fake))
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.load_cert_chain(cert, key)
    srv.socket = ctx.wrap_socket(srv.socket, server_side=True)
    t = threading.Thread(target=srv.serve_forever, daemon=True)
    t.start()
    cfg = KubeConfig(server=f"https://127.0.0.1:{srv.server_address[1]}", token_file=token,
                     ca_file=cert, timeout_s=10)
    try:
        yield fake, cfg
    finally:
        srv.shutdown()
        srv.server_close()


def _a(action_kind: str, **sched: str) -> Action:
    return Action(action_kind, "gpu-1", "abc123", "nvidia-xid-hardware", "train", dict(sched))


def test_quarantine_taints_with_the_exact_patch_and_is_idempotent(
        api: tuple[FakeAPI, KubeConfig]) -> None:
    fake, cfg = api
    b = KubernetesBackend(cfg)
    assert "tainted gpu-1" in b.apply(_a(QUARANTINE))
    get, patch = fake.requests
    assert (get["method"], get["path"], get["auth"]) == ("GET", "/api/v1/nodes/gpu-1",
                                                         f"Bearer {TOKEN}")
    assert (patch["method"], patch["path"], patch["ctype"]) == \
        ("PATCH", "/api/v1/nodes/gpu-1", "application/merge-patch+json")
    assert patch["body"] == {"metadata": {"resourceVersion": "7"}, "spec": {"taints": [
        {"key": "other", "effect": "NoExecute"},
        {"key": TAINT_KEY, "value": "abc123", "effect": "NoSchedule"}]}}
    # again (a replay after a crash): one GET, no PATCH
    assert "already tainted" in b.apply(_a(QUARANTINE))
    assert [r["method"] for r in fake.requests[2:]] == ["GET"]
    # release removes only our taint
    assert "untainted" in b.apply(_a(RELEASE))
    assert fake.nodes["gpu-1"]["spec"]["taints"] == [{"key": "other", "effect": "NoExecute"}]


def test_conflicting_node_update_is_retried(api: tuple[FakeAPI, KubeConfig]) -> None:
    fake, cfg = api
    fake.conflicts = 2
    assert "tainted" in KubernetesBackend(cfg).apply(_a(QUARANTINE))
    assert [r["method"] for r in fake.requests] == ["GET", "PATCH"] * 3


def test_requeue_deletes_the_runs_pod_on_that_node_with_uid_precondition(
        api: tuple[FakeAPI, KubeConfig]) -> None:
    fake, cfg = api
    b = KubernetesBackend(cfg)
    out = b.apply(_a(REQUEUE, kind="kubernetes", namespace="ml", pod="train-worker-0",
                     node="gpu-1"))
    assert out == "deleted pod ml/train-worker-0 on gpu-1"
    assert [(r["method"], r["path"]) for r in fake.requests] == [
        ("GET", "/api/v1/namespaces/ml/pods/train-worker-0"),
        ("DELETE", "/api/v1/namespaces/ml/pods/train-worker-0")]
    assert fake.requests[1]["body"]["preconditions"] == {"uid": "u-1"}
    # a replay: the pod is gone (or recreated elsewhere) -> nothing deleted
    assert "already gone" in b.apply(_a(REQUEUE, kind="kubernetes", namespace="ml",
                                        pod="train-worker-0"))
    fake.pods[("ml", "train-worker-0")] = {"metadata": {"name": "train-worker-0", "uid": "u-9",
                                                        "labels": {"job": "train"}},
                                           "spec": {"nodeName": "gpu-2"}}
    assert "left alone" in b.apply(_a(REQUEUE, kind="kubernetes", namespace="ml",
                                      pod="train-worker-0"))
    assert ("ml", "train-worker-0") in fake.pods


def test_pod_selector_deletes_every_job_pod_on_the_node_only(
        api: tuple[FakeAPI, KubeConfig]) -> None:
    fake, cfg = api
    b = KubernetesBackend(cfg, pod_selector="job={job}")
    b.apply(_a(REQUEUE, kind="kubernetes", namespace="ml"))
    listing = fake.requests[0]
    assert listing["method"] == "GET"
    assert listing["path"] == ("/api/v1/namespaces/ml/pods?labelSelector=job%3Dtrain"
                               "&fieldSelector=spec.nodeName%3Dgpu-1")
    assert sorted(k[1] for k in fake.pods) == ["train-worker-2"]  # on gpu-2: kept


def test_no_kubernetes_identity_deletes_nothing_and_bad_token_fails(
        api: tuple[FakeAPI, KubeConfig], tmp_path: Path) -> None:
    fake, cfg = api
    assert "no Kubernetes identity" in KubernetesBackend(cfg).apply(_a(REQUEUE))
    assert fake.requests == []
    bad = tmp_path / "bad"
    bad.write_text("wrong")
    with pytest.raises(ActuateError, match="401"):
        KubernetesBackend(KubeConfig(cfg.server, bad, cfg.ca_file)).apply(_a(QUARANTINE))


def test_untrusted_server_certificate_is_refused(api: tuple[FakeAPI, KubeConfig]) -> None:
    fake, cfg = api
    with pytest.raises(ActuateError, match="CERTIFICATE_VERIFY_FAILED|certificate"):
        KubernetesBackend(KubeConfig(cfg.server, cfg.token_file, None)).apply(_a(QUARANTINE))
    assert fake.requests == []


def test_rbac_manifest_grants_exactly_the_verbs_used(api: tuple[FakeAPI, KubeConfig]) -> None:
    import yaml

    fake, cfg = api
    b = KubernetesBackend(cfg, pod_selector="job={job}")
    b.apply(_a(QUARANTINE))
    b.apply(_a(REQUEUE, kind="kubernetes", namespace="ml", pod="train-worker-0"))
    b.apply(_a(RELEASE))
    used = set()
    for r in fake.requests:
        parts = r["path"].split("?")[0].strip("/").split("/")
        resource = "nodes" if parts[2] == "nodes" else parts[4]
        single = len(parts) in (4, 6)
        verb = {"GET": "get" if single else "list", "PATCH": "patch",
                "DELETE": "delete"}[r["method"]]
        used.add((resource, verb))
    manifest = Path(__file__).resolve().parents[3] / "deploy" / "kubernetes" / \
        "actuate-rbac.yaml"
    granted = set()
    for doc in yaml.safe_load_all(manifest.read_text()):
        if doc and doc["kind"] == "ClusterRole":
            for rule in doc["rules"]:
                assert rule["apiGroups"] == [""]
                granted |= {(res, v) for res in rule["resources"] for v in rule["verbs"]}
    assert used == granted
