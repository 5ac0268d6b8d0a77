"""Kubernetes actuator: taint a quarantined node NoSchedule and delete the job's pods on it,
through the API server's HTTP paths (bearer token, CA); the job's controller recreates them."""

from __future__ import annotations

import json
import os
import ssl
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from faultwatch.actuate.backend import ActuateError
from faultwatch.actuate.plan import QUARANTINE, RELEASE, REQUEUE, Action
from faultwatch.errors import ConfigError
from faultwatch.nodes.names import K8S_NAME_RE, K8S_NAMESPACE_RE, check, valid_node

TAINT_KEY = "faultwatch.io/quarantine"
TAINT_EFFECT = "NoSchedule"
SA_DIR = Path("/var/run/secrets/kubernetes.io/serviceaccount")
CONFLICT_RETRIES = 5


@dataclass(frozen=True)
class KubeConfig:
    """Where the API server is and how to authenticate (in-cluster defaults)."""

    server: str
    token_file: Path | None
    ca_file: Path | None
    insecure: bool = False  # only for tests against a plain-HTTP stand-in
    timeout_s: float = 30.0

    @classmethod
    def in_cluster(cls) -> KubeConfig:
        host, port = os.environ.get("KUBERNETES_SERVICE_HOST"), \
            os.environ.get("KUBERNETES_SERVICE_PORT", "443")
        if not host:
            raise ConfigError("--k8s-server", "not in a cluster (KUBERNETES_SERVICE_HOST "
                                              "unset): pass --k8s-server URL")
        if ":" in host:
            host = f"[{host}]"
        return cls(server=f"https://{host}:{port}", token_file=SA_DIR / "token",
                   ca_file=SA_DIR / "ca.crt")


class KubernetesBackend:
    """quarantine -> add taint faultwatch.io/quarantine=<decision>:NoSchedule to the node;
    requeue -> delete the run's pod on that node (uid precondition: never a recreated pod),
    and with a pod selector every matching pod of the namespace on that node;
    release -> remove faultwatch's taint."""

    name = "kubernetes"

    def __init__(self, cfg: KubeConfig, pod_selector: str | None = None) -> None:
        self.cfg = cfg
        self.pod_selector = pod_selector  # e.g. "training.kubeflow.org/job-name={job}"
        if cfg.insecure:
            self._ctx: ssl.SSLContext | None = None
        else:
            self._ctx = ssl.create_default_context(
                cafile=str(cfg.ca_file) if cfg.ca_file else None)

    # ---- HTTP ---------------------------------------------------------------------------

    def _request(self, method: str, path: str, body: Any = None,
                 content_type: str = "application/json", ok404: bool = False
                 ) -> dict[str, Any] | None:
        headers = {"Accept": "application/json"}
        if self.cfg.token_file is not None:
            try:
                token = self.cfg.token_file.read_text().strip()  # re-read: tokens rotate
            except OSError as e:
                raise ActuateError(f"kubernetes: cannot read token {self.cfg.token_file}: "
                                   f"{e}") from None
            headers["Authorization"] = f"Bearer {token}"
        data = None
        if body is not None:
            data = json.dumps(body).encode()
            headers["Content-Type"] = content_type
        req = urllib.request.Request(self.cfg.server.rstrip("/") + path, data=data,
                                     method=method, headers=headers)
        try:
            with urllib.request.urlopen(req, timeout=self.cfg.timeout_s,
                                        context=self._ctx) as resp:
                raw = resp.read()
        except urllib.error.HTTPError as e:
            if e.code == 404 and ok404:
                return None
            detail = e.read()[:300].decode(errors="replace")
            raise _HTTPStatus(e.code, f"kubernetes: {method} {path} -> {e.code}: "
                                      f"{detail}") from None
        except (urllib.error.URLError, OSError) as e:
            raise ActuateError(f"kubernetes: {method} {path} failed: {e}") from None
        if not raw:
            return {}
        try:
            out = json.loads(raw)
        except ValueError:
            raise ActuateError(f"kubernetes: {method} {path}: response is not JSON") from None
        return out if isinstance(out, dict) else {}

    # ---- actions ------------------------------------------------------------------------

    def apply(self, action: Action) -> str:
        node = valid_node(action.node)
        if action.kind == QUARANTINE:
            return self._retry_conflict(lambda: self._set_taint(node, action.decision))
        if action.kind == RELEASE:
            return self._retry_conflict(lambda: self._set_taint(node, None))
        if action.kind == REQUEUE:
            return self._delete_pods(node, action)
        raise ActuateError(f"kubernetes: unknown action kind {action.kind!r}")

    def _retry_conflict(self, fn: Any) -> str:
        for _ in range(CONFLICT_RETRIES):
            try:
                return str(fn())
            except _HTTPStatus as e:
                if e.code != 409:
                    raise
        raise ActuateError(f"kubernetes: node update conflicted {CONFLICT_RETRIES} times")

    def _set_taint(self, node: str, decision: str | None) -> str:
        path = f"/api/v1/nodes/{urllib.parse.quote(node, safe='')}"
        obj = self._request("GET", path) or {}
        spec = obj.get("spec") or {}
        taints = [t for t in (spec.get("taints") or []) if isinstance(t, dict)]
        ours = [t for t in taints if t.get("key") == TAINT_KEY]
        if decision is not None and ours:
            return f"{node} already tainted {TAINT_KEY}"
        if decision is None and not ours:
            return f"{node} has no {TAINT_KEY} taint"
        others = [t for t in taints if t.get("key") != TAINT_KEY]
        new = others + ([{"key": TAINT_KEY, "value": decision[:63], "effect": TAINT_EFFECT}]
                        if decision is not None else [])
        rv = (obj.get("metadata") or {}).get("resourceVersion")
        patch: dict[str, Any] = {"spec": {"taints": new}}
        if rv:
            patch["metadata"] = {"resourceVersion": rv}  # optimistic concurrency: 409 retried
        self._request("PATCH", path, patch, content_type="application/merge-patch+json")
        return f"tainted {node} {TAINT_KEY}:{TAINT_EFFECT}" if decision is not None \
            else f"untainted {node}"

    def _delete_pods(self, node: str, action: Action) -> str:
        sched = action.scheduler
        if sched.get("kind") != "kubernetes":
            return f"no Kubernetes identity in decision {action.decision}: no pod deleted"
        ns = check("namespace", sched.get("namespace"), K8S_NAMESPACE_RE)
        done = []
        pods: list[str] = []
        if sched.get("pod") and sched.get("node", node) == node:
            pods.append(check("pod", sched["pod"], K8S_NAME_RE))
        if self.pod_selector:
            sel = self.pod_selector.replace("{job}", action.job)
            q = urllib.parse.urlencode({"labelSelector": sel,
                                        "fieldSelector": f"spec.nodeName={node}"})
            listing = self._request("GET", f"/api/v1/namespaces/{ns}/pods?{q}") or {}
            for item in listing.get("items") or []:
                name = (item.get("metadata") or {}).get("name")
                if isinstance(name, str) and name not in pods:
                    pods.append(check("pod", name, K8S_NAME_RE))
        for pod in pods:
            done.append(self._delete_pod(ns, pod, node))
        return "; ".join(done) or f"no pod of {action.job!r} on {node}"

    def _delete_pod(self, ns: str, pod: str, node: str) -> str:
        path = f"/api/v1/namespaces/{ns}/pods/{pod}"
        obj = self._request("GET", path, ok404=True)
        if obj is None:
            return f"{ns}/{pod}: already gone"
        if (obj.get("spec") or {}).get("nodeName") != node:
            return f"{ns}/{pod}: not on {node} (recreated elsewhere?): left alone"
        uid = (obj.get("metadata") or {}).get("uid")
        body = {"kind": "DeleteOptions", "apiVersion": "v1",
                "preconditions": {"uid": uid} if uid else {}}
        try:
            self._request("DELETE", path, body, ok404=True)
        except _HTTPStatus as e:
            if e.code == 409:  # uid precondition failed: a different pod by that name now
                return f"{ns}/{pod}: replaced meanwhile: left alone"
            raise
        return f"deleted pod {ns}/{pod} on {node}"


# the API server's answers that a retry cannot change: bad request, unauthenticated,
# forbidden (RBAC), not found, invalid
PERMANENT_STATUS = (400, 401, 403, 404, 405, 422)


class _HTTPStatus(ActuateError):
    def __init__(self, code: int, message: str) -> None:
        self.code = code
        super().__init__(message, permanent=code in PERMANENT_STATUS)


def from_args(args: Any) -> KubernetesBackend:
    if args.k8s_server:
        cfg = KubeConfig(server=args.k8s_server,
                         token_file=Path(args.k8s_token_file) if args.k8s_token_file else None,
                         ca_file=Path(args.k8s_ca_file) if args.k8s_ca_file else None,
                         insecure=args.k8s_server.startswith("http://"))
    else:
        cfg = KubeConfig.in_cluster()
    return KubernetesBackend(cfg, pod_selector=args.k8s_pod_selector)
