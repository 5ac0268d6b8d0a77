"""Kubernetes actuator: cordon, taint and label a quarantined node and evict the job's pods on
it (through kubeclient: kubeconfig or in-cluster); the job's controller recreates them."""

from __future__ import annotations

import os
import urllib.parse
from collections.abc import Callable, Mapping
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from faultwatch.actuate.backend import ActuateError, Option
from faultwatch.actuate.kubeclient import ApiStatus, KubeClient, KubeConfig
from faultwatch.actuate.plan import QUARANTINE, RELEASE, REQUEUE, Action
from faultwatch.errors import ConfigError
from faultwatch.registry.names import K8S_NAME_RE, K8S_NAMESPACE_RE, check, valid_node

TAINT_KEY = "faultwatch.io/quarantine"
TAINT_EFFECT = "NoSchedule"
QUARANTINE_LABEL = "faultwatch.io/quarantined"
REASON_ANNOTATION = "faultwatch.io/quarantine-reason"
CORDONED_ANNOTATION = "faultwatch.io/cordoned"
EVENT_COMPONENT = "faultwatch-actuate"
EVICT, DELETE = "evict", "delete"
POD_ACTIONS = (EVICT, DELETE)
CONFLICT_RETRIES = 5


class KubernetesBackend:
    """quarantine -> cordon the node, add taint faultwatch.io/quarantine=<decision>:NoSchedule,
    label it faultwatch.io/quarantined=true and annotate the reason; requeue -> evict the run's
    pod on that node through the Eviction API (PodDisruptionBudgets respected; uid
    precondition: never a recreated pod), or delete it with pod_action="delete"; with a pod
    selector every matching pod of the namespace on that node; release -> remove faultwatch's
    taint, label and annotations, and uncordon only a node faultwatch cordoned. Each action
    posts an Event (best effort) so `kubectl describe` shows why."""

    name = "kubernetes"

    def __init__(self, client: KubeClient, pod_selector: str | None = None,
                 pod_action: str = EVICT) -> None:
        if pod_action not in POD_ACTIONS:
            raise ConfigError("--k8s-pod-action", f"{pod_action!r}: one of {POD_ACTIONS}")
        self.pod_selector = pod_selector  # e.g. "training.kubeflow.org/job-name={job}"
        self.pod_action = pod_action
        self.client = client

    def _request(self, method: str, path: str, body: Any = None,
                 content_type: str = "application/json", ok404: bool = False
                 ) -> dict[str, Any] | None:
        return self.client.request(method, path, body, content_type, ok404)

    # ---- actions ------------------------------------------------------------------------

    def apply(self, action: Action) -> str:
        node = valid_node(action.node)
        if action.kind == QUARANTINE:
            return self._retry_conflict(lambda: self._quarantine(node, action))
        if action.kind == RELEASE:
            return self._retry_conflict(lambda: self._release(node, action))
        if action.kind == REQUEUE:
            return self._move_pods(node, action)
        raise ActuateError(f"kubernetes: unknown action kind {action.kind!r}")

    def _retry_conflict(self, fn: Callable[[], str]) -> str:
        for _ in range(CONFLICT_RETRIES):
            try:
                return fn()
            except ApiStatus as e:
                if e.code != 409:
                    raise
        raise ActuateError(f"kubernetes: node update conflicted {CONFLICT_RETRIES} times")

    def _node(self, node: str) -> tuple[str, dict[str, Any]]:
        path = f"/api/v1/nodes/{urllib.parse.quote(node, safe='')}"
        obj = self._request("GET", path, ok404=True)
        if obj is None:
            raise ApiStatus(404, "GET", path, f"node {node} does not exist")
        return path, obj

    def _before_patch(self, node: str) -> None:
        """Between reading a node and patching it (tests race a writer here)."""

    def _before_pod_action(self, ns: str, pod: str) -> None:
        """Between reading a pod and evicting or deleting it (tests race a writer here)."""

    def _quarantine(self, node: str, action: Action) -> str:
        path, obj = self._node(node)
        meta = obj.get("metadata") or {}
        spec = obj.get("spec") or {}
        taints = [t for t in (spec.get("taints") or []) if isinstance(t, dict)]
        if any(t.get("key") == TAINT_KEY for t in taints):
            return f"{node} already tainted {TAINT_KEY}"
        reason = _reason(action)
        annotations: dict[str, Any] = {REASON_ANNOTATION: reason}
        cordon = not spec.get("unschedulable")
        if cordon:
            annotations[CORDONED_ANNOTATION] = "true"  # release uncordons only what we cordoned
        patch: dict[str, Any] = {
            "metadata": {"labels": {QUARANTINE_LABEL: "true"}, "annotations": annotations},
            "spec": {"unschedulable": True, "taints": taints + [
                {"key": TAINT_KEY, "value": _label_value(action.decision),
                 "effect": TAINT_EFFECT}]}}
        if meta.get("resourceVersion"):  # optimistic concurrency: a 409 is retried
            patch["metadata"]["resourceVersion"] = meta["resourceVersion"]
        self._before_patch(node)
        self._request("PATCH", path, patch, content_type="application/merge-patch+json")
        done = (f"{'cordoned, ' if cordon else ''}tainted {node} {TAINT_KEY}:{TAINT_EFFECT}, "
                f"labelled {QUARANTINE_LABEL}=true")
        return done + self._event("Node", node, meta.get("uid"), "default",
                                  "FaultwatchQuarantine",
                                  f"faultwatch quarantined {node}: {reason}")

    def _release(self, node: str, action: Action) -> str:
        path, obj = self._node(node)
        meta = obj.get("metadata") or {}
        spec = obj.get("spec") or {}
        taints = [t for t in (spec.get("taints") or []) if isinstance(t, dict)]
        annotations = meta.get("annotations") or {}
        labels = meta.get("labels") or {}
        ours = [t for t in taints if t.get("key") == TAINT_KEY]
        if not ours and QUARANTINE_LABEL not in labels and CORDONED_ANNOTATION not in annotations:
            return f"{node} has no {TAINT_KEY} taint"
        uncordon = annotations.get(CORDONED_ANNOTATION) == "true"
        patch: dict[str, Any] = {
            "metadata": {"labels": {QUARANTINE_LABEL: None},
                         "annotations": {REASON_ANNOTATION: None, CORDONED_ANNOTATION: None}},
            "spec": {"taints": [t for t in taints if t.get("key") != TAINT_KEY]}}
        if uncordon:
            patch["spec"]["unschedulable"] = False
        if meta.get("resourceVersion"):
            patch["metadata"]["resourceVersion"] = meta["resourceVersion"]
        self._before_patch(node)
        self._request("PATCH", path, patch, content_type="application/merge-patch+json")
        done = f"untainted{', uncordoned' if uncordon else ''} {node}"
        return done + self._event("Node", node, meta.get("uid"), "default",
                                  "FaultwatchRelease",
                                  f"faultwatch released {node} ({action.decision})")

    def _move_pods(self, node: str, action: Action) -> str:
        sched = action.scheduler
        if sched.get("kind") != "kubernetes":
            return f"no Kubernetes identity in decision {action.decision}: no pod moved"
        ns = check("namespace", sched.get("namespace"), K8S_NAMESPACE_RE)
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
        done = [self._move_pod(ns, pod, node, action) for pod in pods]
        return "; ".join(done) or f"no pod of {action.job!r} on {node}"

    def _move_pod(self, ns: str, pod: str, node: str, action: Action) -> str:
        path = f"/api/v1/namespaces/{ns}/pods/{pod}"
        obj = self._request("GET", path, ok404=True)
        if obj is None:
            return f"{ns}/{pod}: already gone"
        if (obj.get("spec") or {}).get("nodeName") != node:
            return f"{ns}/{pod}: not on {node} (recreated elsewhere?): left alone"
        uid = (obj.get("metadata") or {}).get("uid")
        options: dict[str, Any] = {"preconditions": {"uid": uid}} if uid else {}
        self._before_pod_action(ns, pod)
        try:
            if self.pod_action == EVICT:
                gone = self._request("POST", f"{path}/eviction",
                                     {"apiVersion": "policy/v1", "kind": "Eviction",
                                      "metadata": {"name": pod, "namespace": ns},
                                      "deleteOptions": options}, ok404=True) is None
            else:
                gone = self._request("DELETE", path, {"kind": "DeleteOptions",
                                                      "apiVersion": "v1", **options},
                                     ok404=True) is None
        except ApiStatus as e:
            if e.code == 409:  # uid precondition failed: a different pod by that name now
                return f"{ns}/{pod}: replaced meanwhile: left alone"
            if e.code == 429 and self.pod_action == EVICT:
                raise ActuateError(  # retried: the budget may allow it later
                    f"kubernetes: eviction of {ns}/{pod} refused (429): {e.detail} — the "
                    f"pod keeps running on {node}; retried, or use --k8s-pod-action delete "
                    "to override PodDisruptionBudgets") from None
            raise
        if gone:  # deleted between our read and the eviction: nothing left to move
            return f"{ns}/{pod}: already gone"
        verb = "evicted" if self.pod_action == EVICT else "deleted"
        return f"{verb} pod {ns}/{pod} on {node}" + self._event(
            "Pod", pod, uid, ns, "FaultwatchRequeue",
            f"faultwatch {verb} {pod}: node {node} quarantined ({_reason(action)})")

    def _event(self, kind: str, name: str, uid: Any, ns: str, reason: str,
               message: str) -> str:
        """Post a core/v1 Event about the object (best effort: the action is done already)."""
        now = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        involved: dict[str, Any] = {"apiVersion": "v1", "kind": kind, "name": name}
        if kind == "Pod":
            involved["namespace"] = ns
        if isinstance(uid, str):
            involved["uid"] = uid
        body = {"apiVersion": "v1", "kind": "Event",
                "metadata": {"generateName": f"{name}.faultwatch-", "namespace": ns},
                "involvedObject": involved, "reason": reason, "message": message[:1024],
                "type": "Warning", "source": {"component": EVENT_COMPONENT},
                "reportingComponent": EVENT_COMPONENT, "reportingInstance": _instance(),
                "firstTimestamp": now, "lastTimestamp": now, "count": 1}
        try:
            self._request("POST", f"/api/v1/namespaces/{ns}/events", body)
        except ActuateError as e:
            return f" (event not posted: {e})"
        return ""


def _reason(action: Action) -> str:
    rule = f"rule {action.rule}, " if action.rule else ""
    job = f"job {action.job}, " if action.job else ""
    return f"{rule}{job}decision {action.decision}"


def _label_value(text: str) -> str:
    """A valid label/taint value: at most 63 characters of [A-Za-z0-9_.-], alphanumeric ends."""
    out = "".join(c if c.isascii() and (c.isalnum() or c in "-_.") else "-" for c in text)[:63]
    return out.strip("-_.")


def _instance() -> str:
    return os.environ.get("HOSTNAME") or os.uname().nodename


NAME = "kubernetes"
TITLE = ("kubernetes (needs faultwatch[kubernetes]; kubectl's credentials: --kubeconfig, "
         "else $KUBECONFIG, ~/.kube/config, in-cluster)")
CONNECTION = (
    Option("--kubeconfig", "kubeconfig file: contexts, client certificates, tokens, exec "
           "credential plugins (default: $KUBECONFIG, a ':'-separated list, else "
           "~/.kube/config, else the in-cluster service account)", metavar="FILE"),
    Option("--context", "kubeconfig context (default: its current-context)", metavar="NAME"),
)  # also `faultwatch process --allocation-check kubernetes`'s (streams/allocations.py)
OPTIONS = (
    *CONNECTION,
    Option("--k8s-pod-selector", "also move every pod on the node matching this label "
           "selector; {job} is the faultwatch job, e.g. training.kubeflow.org/job-name={job}"),
    Option("--k8s-pod-action", "how a pod leaves a quarantined node: the Eviction API, which "
           "respects PodDisruptionBudgets (a refusal is retried), or a plain delete (default: "
           "%(default)s)", EVICT, choices=(EVICT, DELETE)),
)


def build(opts: Mapping[str, Any]) -> KubernetesBackend:
    """--kubeconfig/--context (else $KUBECONFIG, ~/.kube/config, in-cluster); the credentials
    are loaded and the server asked its version at start, so a wrong context fails here."""
    cfg = KubeConfig(kubeconfig=Path(opts["kubeconfig"]) if opts["kubeconfig"] else None,
                     context=opts["context"])
    client = KubeClient(cfg)
    client.connect()
    return KubernetesBackend(client, pod_selector=opts["k8s_pod_selector"],
                             pod_action=opts["k8s_pod_action"])
