"""A real Kubernetes API server for tests: etcd, kube-apiserver and kube-controller-manager.

`scripts/k8s-api.sh` builds them from the Go module proxy once per version (cached under
~/.cache/faultwatch/k8s) and starts them on loopback with a self-signed serving certificate,
service-account keys, RBAC and an admin token user. Service accounts get their tokens from
the TokenRequest API, so RBAC is exercised exactly as in a cluster.
"""

from __future__ import annotations

import json
import os
import shutil
import ssl
import subprocess
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import yaml

from tests.support.waiting import wait_until

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "scripts" / "k8s-api.sh"


class ApiError(RuntimeError):
    """The API server answered with an error status."""

    def __init__(self, code: int, method: str, path: str, body: Any) -> None:
        self.code = code
        self.body = body
        super().__init__(f"{method} {path} -> {code}: {body}")


def missing() -> str | None:
    """Why no API server can be built or started here, or None when it can."""
    cache = Path(os.environ.get("FAULTWATCH_K8S_CACHE", Path.home() / ".cache/faultwatch/k8s"))
    built = list(cache.glob("v*/bin/kube-apiserver")) and list(cache.glob("crds/keda-v*/*.yaml"))
    if not built and shutil.which("go") is None:
        return "no Go toolchain to build kube-apiserver (scripts/k8s-api.sh build)"
    if shutil.which("openssl") is None:
        return "openssl is missing"
    return None


class KubeAPI:
    """Admin access to a running API server, plus what tests need around it."""

    def __init__(self, state: Path) -> None:
        self.state = state
        env = dict(line.split("=", 1) for line in (state / "env").read_text().splitlines()
                   if "=" in line)
        self.server = env["K8S_SERVER"]
        self.ca = Path(env["K8S_CA"])
        self.admin_token = env["K8S_ADMIN_TOKEN"]
        self._ctx = ssl.create_default_context(cafile=str(self.ca))
        self._resources: dict[tuple[str, str], tuple[str, bool]] = {}

    # ---- HTTP -------------------------------------------------------------------------

    def request(self, method: str, path: str, body: Any = None, *, token: str | None = None,
                content_type: str = "application/json") -> Any:
        headers = {"Accept": "application/json",
                   "Authorization": f"Bearer {token or self.admin_token}"}
        data = None
        if body is not None:
            data = json.dumps(body).encode()
            headers["Content-Type"] = content_type
        req = urllib.request.Request(self.server + path, data=data, method=method,
                                     headers=headers)
        try:
            with urllib.request.urlopen(req, timeout=30, context=self._ctx) as resp:
                raw = resp.read()
        except urllib.error.HTTPError as e:
            raw = e.read()
            try:
                detail: Any = json.loads(raw)
            except ValueError:
                detail = raw[:500].decode(errors="replace")
            raise ApiError(e.code, method, path, detail) from None
        return json.loads(raw) if raw else {}

    def get(self, path: str) -> Any:
        return self.request("GET", path)

    def exists(self, path: str) -> bool:
        try:
            self.get(path)
        except ApiError as e:
            if e.code == 404:
                return False
            raise
        return True

    # ---- objects ----------------------------------------------------------------------

    def path_of(self, obj: dict[str, Any], *, collection: bool = True) -> str:
        """The REST path of an object (its collection, or itself), found by discovery."""
        api_version, kind = obj["apiVersion"], obj["kind"]
        key = (api_version, kind)
        if key not in self._resources:
            base = "/api/v1" if api_version == "v1" else f"/apis/{api_version}"
            for res in self.get(base)["resources"]:
                if "/" not in res["name"]:
                    self._resources[(api_version, res["kind"])] = (res["name"],
                                                                   res["namespaced"])
        if key not in self._resources:
            raise KeyError(f"the API server serves no {kind} in {api_version}")
        plural, namespaced = self._resources[key]
        base = "/api/v1" if api_version == "v1" else f"/apis/{api_version}"
        if namespaced:
            ns = (obj.get("metadata") or {}).get("namespace") or "default"
            base += f"/namespaces/{ns}"
        path = f"{base}/{plural}"
        return path if collection else f"{path}/{obj['metadata']['name']}"

    def create(self, obj: dict[str, Any], *, dry_run: bool = False,
               token: str | None = None) -> Any:
        q = "?fieldValidation=Strict" + ("&dryRun=All" if dry_run else "")
        return self.request("POST", self.path_of(obj) + q, obj, token=token)

    def ensure(self, obj: dict[str, Any]) -> Any:
        """Create the object; one that exists already is left as it is."""
        try:
            return self.create(obj)
        except ApiError as e:
            if e.code != 409:
                raise
            return self.get(self.path_of(obj, collection=False))

    def apply_file(self, path: Path) -> list[Any]:
        return [self.ensure(d) for d in load_docs(path)]

    def namespace(self, name: str) -> None:
        self.ensure({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}})
        wait_until(lambda: self.exists(f"/api/v1/namespaces/{name}/serviceaccounts/default"),
                   30, f"the default ServiceAccount of {name}")

    def node(self, name: str, **spec: Any) -> Any:
        return self.ensure({"apiVersion": "v1", "kind": "Node",
                            "metadata": {"name": name}, "spec": spec})

    def pod(self, ns: str, name: str, node: str, labels: dict[str, str] | None = None, *,
            running: bool = False) -> Any:
        """A pod bound to `node`; `running` reports it Running and Ready as a kubelet would
        (the Eviction API checks budgets only for running pods: pending ones just go)."""
        obj = self.ensure({
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "namespace": ns, "labels": labels or {}},
            "spec": {"nodeName": node, "containers": [{"name": "train", "image": "train:1"}]}})
        if running:
            obj = self.request(
                "PATCH", f"/api/v1/namespaces/{ns}/pods/{name}/status",
                {"status": {"phase": "Running", "conditions": [
                    {"type": "Ready", "status": "True"}]}},
                content_type="application/merge-patch+json")
        return obj

    def token_for(self, ns: str, service_account: str) -> str:
        """A bound token of a service account (TokenRequest API), as a pod would mount."""
        self.ensure({"apiVersion": "v1", "kind": "ServiceAccount",
                     "metadata": {"name": service_account, "namespace": ns}})
        out = self.request(
            "POST", f"/api/v1/namespaces/{ns}/serviceaccounts/{service_account}/token",
            {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest",
             "spec": {"expirationSeconds": 3600}})
        return str(out["status"]["token"])

    def kubeconfig(self, path: Path, *, token: str | None = None,
                   exec_argv: list[str] | None = None,
                   exec_api: str = "client.authentication.k8s.io/v1",
                   cert: tuple[Path, Path] | None = None,
                   extra_contexts: dict[str, str] | None = None, current: str = "fw") -> Path:
        """A kubeconfig for this server (its CA by file) whose current context's user
        presents `token`, a client certificate (cert, key), or runs `exec_argv` as an exec
        credential plugin; `extra_contexts` adds contexts name -> token; `current` is the
        current-context (mode 0600)."""
        user: dict[str, Any] = {}
        if token is not None:
            user["token"] = token
        if cert is not None:
            user["client-certificate"], user["client-key"] = str(cert[0]), str(cert[1])
        if exec_argv is not None:
            user["exec"] = {"apiVersion": exec_api, "command": exec_argv[0],
                            "args": exec_argv[1:], "interactiveMode": "Never"}
        users = [{"name": "fw", "user": user}]
        contexts = [{"name": "fw", "context": {"cluster": "fw", "user": "fw"}}]
        for name, tok in (extra_contexts or {}).items():
            users.append({"name": name, "user": {"token": tok}})
            contexts.append({"name": name, "context": {"cluster": "fw", "user": name}})
        doc = {"apiVersion": "v1", "kind": "Config", "current-context": current,
               "clusters": [{"name": "fw", "cluster": {"server": self.server,
                                                       "certificate-authority": str(self.ca)}}],
               "contexts": contexts, "users": users}
        path.write_text(yaml.safe_dump(doc))
        path.chmod(0o600)
        return path

    def events_about(self, ns: str, kind: str, name: str) -> list[dict[str, Any]]:
        sel = urllib.parse.urlencode({"fieldSelector": f"involvedObject.kind={kind},"
                                                       f"involvedObject.name={name}"})
        return list(self.get(f"/api/v1/namespaces/{ns}/events?{sel}")["items"])


def load_docs(path: Path) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all(path.read_text()) if d]


def start(state: Path) -> KubeAPI:
    """Build (once) and start etcd, kube-apiserver and kube-controller-manager."""
    proc = subprocess.run(["bash", str(SCRIPT), "start", str(state)], capture_output=True,
                          text=True, timeout=3600)
    if proc.returncode != 0:
        raise RuntimeError(f"scripts/k8s-api.sh start failed ({proc.returncode}):\n"
                           f"{proc.stderr[-3000:]}")
    return KubeAPI(state)


def published_crds() -> list[Path]:
    """The CRDs deploy/ needs, as their projects publish them (KEDA's ScaledObject and
    TriggerAuthentication from its Go module; `scripts/k8s-api.sh crds` fetches them once)."""
    proc = subprocess.run(["bash", str(SCRIPT), "crds"], capture_output=True, text=True,
                          timeout=600)
    if proc.returncode != 0:
        raise RuntimeError(f"scripts/k8s-api.sh crds failed ({proc.returncode}):\n"
                           f"{proc.stderr[-3000:]}")
    return sorted(Path(proc.stdout.strip()).glob("*.yaml"))


def kubeflow_retries(codes: Iterable[int]) -> dict[int, bool]:
    """What Kubeflow's training-operator itself (`train.IsRetryableExitCode`, built from its
    Go module by `scripts/k8s-api.sh kubeflow`) says of each exit code: retried or not by a
    PyTorchJob with `restartPolicy: ExitCode`."""
    proc = subprocess.run(["bash", str(SCRIPT), "kubeflow"], capture_output=True, text=True,
                          timeout=900)
    if proc.returncode != 0:
        raise RuntimeError(f"scripts/k8s-api.sh kubeflow failed ({proc.returncode}):\n"
                           f"{proc.stderr[-3000:]}")
    out = subprocess.run([proc.stdout.strip(), *map(str, codes)], capture_output=True,
                         text=True, timeout=60, check=True).stdout
    return {int(c): v == "true" for c, v in (line.split() for line in out.splitlines())}


def stop(state: Path) -> None:
    subprocess.run(["bash", str(SCRIPT), "stop", str(state)], capture_output=True, timeout=120)


def rules_of(docs: Iterable[dict[str, Any]], kind: str = "ClusterRole") -> list[dict[str, Any]]:
    return [r for d in docs if d.get("kind") == kind for r in d.get("rules", [])]
