"""The Kubernetes actuator and deploy/ against a real kube-apiserver (etcd, RBAC, the disruption
controller): the service account of deploy/kubernetes/actuate-rbac.yaml, with a bound token
from the TokenRequest API, cordons/taints/labels nodes, evicts pods (budgets respected; a pod
replaced or gone meanwhile left alone) or deletes them, posts Events and releases; each RBAC
rule is shown to be needed; every manifest passes a server-side dry run (KEDA's CRDs as KEDA
publishes them); the documented podFailurePolicy Job is created, and the Job controller applies
that policy to the agent's exit codes (docs/schedulers.md#exit-codes); `faultwatch actuate`
removes the taint when a quarantine expires."""

from __future__ import annotations

import copy
import textwrap
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from faultwatch.actuate.backend import ActuateError
from faultwatch.actuate.kubeclient import KubeClient, KubeConfig
from faultwatch.actuate.kubernetes import (
    CORDONED_ANNOTATION,
    QUARANTINE_LABEL,
    REASON_ANNOTATION,
    TAINT_KEY,
    KubernetesBackend,
)
from faultwatch.actuate.plan import QUARANTINE, RELEASE, REQUEUE, Action
from faultwatch.agents import exitcodes
from tests.support import k8s
from tests.support.k8s import ApiError, KubeAPI, load_docs, rules_of
from tests.support.waiting import wait_until

REPO = Path(__file__).resolve().parents[2]
DEPLOY = REPO / "deploy" / "kubernetes"
RBAC = DEPLOY / "actuate-rbac.yaml"
SA_NS, SA_NAME = "faultwatch", "faultwatch-actuate"

pytestmark = [pytest.mark.k8s, pytest.mark.slow]


@pytest.fixture(scope="module")
def api(tmp_path_factory: pytest.TempPathFactory) -> Iterator[KubeAPI]:
    why = k8s.missing()
    if why:
        pytest.skip(why)
    state = tmp_path_factory.mktemp("k8s")
    kube = k8s.start(state)
    try:
        kube.apply_file(RBAC)
        kube.namespace("ml")
        yield kube
    finally:
        k8s.stop(state)


def _client(api: KubeAPI, tmp: Path, token: str) -> KubeClient:
    """The client as an operator's kubeconfig with that token configures it."""
    return KubeClient(KubeConfig(api.kubeconfig(tmp / f"kubeconfig-{uuid.uuid4().hex[:6]}",
                                                token=token)))


def _backend(api: KubeAPI, tmp: Path, token: str, **kw: Any) -> KubernetesBackend:
    return KubernetesBackend(_client(api, tmp, token), **kw)


@pytest.fixture()
def actuator(api: KubeAPI, tmp_path: Path) -> KubernetesBackend:
    """The backend as the service account deploy/ ships, with exactly its ClusterRole."""
    return _backend(api, tmp_path, api.token_for(SA_NS, SA_NAME),
                    pod_selector="job={job}")


def _names() -> tuple[str, str]:
    u = uuid.uuid4().hex[:6]
    return f"gpu-{u}", f"train-{u}"


def _action(kind: str, at: str, job: str, **sched: str) -> Action:
    """An action on node `at`; `sched` fields make a Kubernetes identity (pod=, node=)."""
    scheduler = {"kind": "kubernetes", "namespace": "ml", **sched} if sched else {}
    return Action(kind=kind, node=at, decision=f"d{uuid.uuid4().hex[:10]}",
                  rule="nvidia-xid-79", job=job, scheduler=scheduler)


def test_quarantine_requeue_release_with_the_shipped_rbac(api: KubeAPI,
                                                          actuator: KubernetesBackend) -> None:
    node, job = _names()
    other = node + "-ok"
    api.node(node, taints=[{"key": "team", "value": "a", "effect": "NoSchedule"}])
    api.node(other)
    api.pod("ml", f"{job}-0", node, {"job": job})
    api.pod("ml", f"{job}-1", node, {"job": job})
    api.pod("ml", f"{job}-2", other, {"job": job})

    q = _action(QUARANTINE, node, job)
    said = actuator.apply(q)
    assert "cordoned" in said and "tainted" in said, said
    obj = api.get(f"/api/v1/nodes/{node}")
    assert obj["spec"]["unschedulable"] is True
    taints = {t["key"]: t for t in obj["spec"]["taints"]}
    assert taints[TAINT_KEY] == {"key": TAINT_KEY, "value": q.decision, "effect": "NoSchedule"}
    assert "team" in taints  # someone else's taint is kept
    assert obj["metadata"]["labels"][QUARANTINE_LABEL] == "true"
    assert "nvidia-xid-79" in obj["metadata"]["annotations"][REASON_ANNOTATION]
    events = api.events_about("default", "Node", node)
    assert [e["reason"] for e in events] == ["FaultwatchQuarantine"], events
    assert q.decision in events[0]["message"]
    assert "already tainted" in actuator.apply(q)  # idempotent: a replay changes nothing

    said = actuator.apply(_action(REQUEUE, node, job, pod=f"{job}-0", node=node))
    assert said.count("evicted pod") == 2, said  # the run's pod and the selector's other one
    for i in (0, 1):  # evicted: no kubelet here, so the pod is left terminating
        pod = api.get(f"/api/v1/namespaces/ml/pods/{job}-{i}")
        assert pod["metadata"].get("deletionTimestamp"), pod["metadata"]
    assert not api.get(f"/api/v1/namespaces/ml/pods/{job}-2")["metadata"].get(
        "deletionTimestamp")  # on a healthy node: untouched
    assert [e["reason"] for e in api.events_about("ml", "Pod", f"{job}-0")] == [
        "FaultwatchRequeue"]

    said = actuator.apply(_action(RELEASE, node, job))
    assert "untainted, uncordoned" in said, said
    obj = api.get(f"/api/v1/nodes/{node}")
    assert not obj["spec"].get("unschedulable")
    keys = [t["key"] for t in obj["spec"]["taints"]]  # admission adds not-ready to new nodes
    assert "team" in keys and TAINT_KEY not in keys, keys
    assert QUARANTINE_LABEL not in obj["metadata"].get("labels", {})
    assert CORDONED_ANNOTATION not in obj["metadata"].get("annotations", {})
    assert "has no" in actuator.apply(_action(RELEASE, node, job))


def test_release_keeps_an_operators_cordon(api: KubeAPI, actuator: KubernetesBackend) -> None:
    node, job = _names()
    api.node(node, unschedulable=True)  # an operator cordoned it before faultwatch came
    said = actuator.apply(_action(QUARANTINE, node, job))
    assert "cordoned" not in said and "tainted" in said, said
    assert "uncordoned" not in actuator.apply(_action(RELEASE, node, job))
    obj = api.get(f"/api/v1/nodes/{node}")
    assert obj["spec"]["unschedulable"] is True
    assert TAINT_KEY not in {t["key"] for t in obj["spec"].get("taints", [])}


def _tainted(api: KubeAPI, node: str) -> bool:
    return TAINT_KEY in {t["key"] for t in api.get(f"/api/v1/nodes/{node}")["spec"]
                         .get("taints", [])}


@pytest.mark.parametrize(("exec_api", "revoke"), [
    ("client.authentication.k8s.io/v1", True),  # kubectl's GA version
    ("client.authentication.k8s.io/v1beta1", False)])  # what EKS/GKE/AKS plugins print
def test_an_exec_credential_plugin_in_the_context_chosen_by_name(
        api: KubeAPI, tmp_path: Path, exec_api: str, revoke: bool) -> None:
    """A kubeconfig whose user runs an exec credential plugin (as `aws eks get-token`,
    gke-gcloud-auth-plugin and kubelogin are run): a script that prints an ExecCredential
    with a bound token of the shipped service account from the TokenRequest API. The context
    is chosen by name: the file's current-context has a token the server refuses (401 there:
    the control). When the token is revoked (the Secret it is bound to is deleted) the server
    answers 401 and the plugin is run again for a fresh one."""
    import sys

    admin = tmp_path / "admin-token"
    admin.write_text(api.admin_token)
    admin.chmod(0o600)
    count = tmp_path / "plugin-runs"
    count.touch()
    plugin = [sys.executable, str(REPO / "tests" / "support" / "exec_credential.py"),
              api.server, str(api.ca), str(admin), SA_NS, SA_NAME, exec_api, str(count)]
    kc = api.kubeconfig(tmp_path / "kubeconfig", exec_argv=plugin, exec_api=exec_api,
                        extra_contexts={"stale": "not-a-valid-token"}, current="stale")
    with pytest.raises(ActuateError, match="401") as err:  # the file's current-context
        KubeClient(KubeConfig(kc)).connect()
    assert err.value.permanent
    assert count.read_text() == ""  # that context's user has no plugin

    client = KubeClient(KubeConfig(kc, context="fw"))
    client.connect()
    backend = KubernetesBackend(client)
    node, job = _names()
    api.node(node)
    assert "tainted" in backend.apply(_action(QUARANTINE, node, job))
    assert _tainted(api, node)
    runs = count.read_text().splitlines()
    assert len(runs) == 1, runs  # the credential is kept while the server takes it
    if not revoke:  # (the server caches a valid token for 10 s: the revocation, once)
        return
    secret, token = runs[0].split()
    api.request("DELETE", f"/api/v1/namespaces/{SA_NS}/secrets/{secret}")  # revoked
    wait_until(lambda: _refused(api, token), 60, "the revoked token to be refused (401)")
    assert "untainted" in backend.apply(_action(RELEASE, node, job))
    assert not _tainted(api, node)
    assert len(count.read_text().splitlines()) == 2  # the 401 made the plugin run again


def _refused(api: KubeAPI, token: str) -> bool:
    try:
        api.request("GET", "/version", token=token)
    except ApiError as e:
        if e.code == 401:
            return True
        raise
    return False


def test_a_client_certificate_from_a_relative_path(api: KubeAPI, tmp_path: Path) -> None:
    """A kubeconfig user with a client certificate (signed by the API server's client CA)
    whose paths are relative to the kubeconfig's directory, as kubectl resolves them; the
    shipped ClusterRole bound to that user's name is enough to quarantine."""
    import os
    import subprocess

    user = f"fw-cert-{uuid.uuid4().hex[:6]}"
    pki = api.ca.parent
    d = tmp_path / "kube"
    d.mkdir()
    subprocess.run(["openssl", "req", "-newkey", "rsa:2048", "-nodes", "-subj", f"/CN={user}",
                    "-keyout", str(d / "user.key"), "-out", str(d / "user.csr")],
                   check=True, capture_output=True)
    subprocess.run(["openssl", "x509", "-req", "-in", str(d / "user.csr"), "-CA", str(api.ca),
                    "-CAkey", str(pki / "ca.key"), "-CAcreateserial", "-days", "1",
                    "-out", str(d / "user.crt")], check=True, capture_output=True)
    api.ensure({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
                "metadata": {"name": user},
                "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole",
                            "name": SA_NAME},
                "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User",
                              "name": user}]})
    kc = api.kubeconfig(d / "config", cert=(Path("user.crt"), Path("user.key")))
    cwd = os.getcwd()
    os.chdir(tmp_path)  # not the kubeconfig's directory: the paths resolve against that
    try:
        backend = KubernetesBackend(KubeClient(KubeConfig(kc)))
        node, job = _names()
        api.node(node)
        said = wait_until(lambda: _try(backend, _action(QUARANTINE, node, job)), 30,
                          f"the binding of {user} to be in force")
    finally:
        os.chdir(cwd)
    assert "tainted" in said and _tainted(api, node)


def _try(backend: KubernetesBackend, action: Action) -> str | None:
    """The action's outcome, or None while RBAC still refuses it (a new binding)."""
    try:
        return backend.apply(action)
    except ActuateError as e:
        if "403" in str(e):
            return None
        raise


def _budgeted_pods(api: KubeAPI, pods: int) -> tuple[str, str]:
    """A node running `pods` pods of a job that a PodDisruptionBudget keeps all available
    (minAvailable = pods), once the disruption controller has counted them (before, every
    eviction is 429 anyway); returns (node, job)."""
    node, job = _names()
    api.node(node)
    for i in range(pods):
        api.pod("ml", f"{job}-{i}", node, {"job": job, "app": job}, running=True)
    api.ensure({"apiVersion": "policy/v1", "kind": "PodDisruptionBudget",
                "metadata": {"name": job, "namespace": "ml"},
                "spec": {"minAvailable": pods, "selector": {"matchLabels": {"app": job}}}})
    pdb = f"/apis/policy/v1/namespaces/ml/poddisruptionbudgets/{job}"
    wait_until(lambda: api.get(pdb).get("status", {}).get("currentHealthy") == pods, 60,
               f"the disruption controller to count {pods} pod(s) healthy")
    return node, job


def test_a_disruption_budget_refuses_the_eviction_with_a_clear_outcome(
        api: KubeAPI, actuator: KubernetesBackend, tmp_path: Path) -> None:
    node, job = _budgeted_pods(api, 2)
    pdb = f"/apis/policy/v1/namespaces/ml/poddisruptionbudgets/{job}"
    requeue = _action(REQUEUE, node, job, pod=f"{job}-0", node=node)
    with pytest.raises(ActuateError) as err:
        actuator.apply(requeue)
    text = str(err.value)
    assert "refused (429)" in text and "disruption budget" in text and "keeps running" in text
    assert not api.get(f"/api/v1/namespaces/ml/pods/{job}-0")["metadata"].get(
        "deletionTimestamp")
    # positive control in the same setup: with room in the budget the same eviction goes ahead
    api.request("PATCH", pdb, {"spec": {"minAvailable": 1}},
                content_type="application/merge-patch+json")
    wait_until(lambda: api.get(pdb)["status"].get("disruptionsAllowed", 0) >= 1, 60,
               "the budget to allow one")
    # (only the run's pod: the selector would take the second one too, which the budget refuses)
    alone = _backend(api, tmp_path, api.token_for(SA_NS, SA_NAME))
    assert "evicted pod" in alone.apply(requeue)
    assert api.get(f"/api/v1/namespaces/ml/pods/{job}-0")["metadata"].get("deletionTimestamp")


def test_a_conflicting_write_is_retried_and_a_missing_node_is_permanent(
        api: KubeAPI, tmp_path: Path) -> None:
    node, job = _names()
    api.node(node)
    token = api.token_for(SA_NS, SA_NAME)

    class Raced(KubernetesBackend):
        races = 2

        def _before_patch(self, n: str) -> None:  # another writer between GET and PATCH
            if self.races:
                self.races -= 1
                api.request("PATCH", f"/api/v1/nodes/{n}",
                            {"metadata": {"labels": {"other-writer": str(self.races)}}},
                            content_type="application/merge-patch+json")

    raced = Raced(_client(api, tmp_path, token))
    assert "tainted" in raced.apply(_action(QUARANTINE, node, job))
    assert raced.races == 0  # both races happened: two real 409s were retried
    obj = api.get(f"/api/v1/nodes/{node}")
    assert obj["metadata"]["labels"]["other-writer"] == "0"  # the other write is kept
    assert TAINT_KEY in {t["key"] for t in obj["spec"]["taints"]}

    with pytest.raises(ActuateError) as err:
        raced.apply(_action(QUARANTINE, "gpu-absent", job))
    assert "404" in str(err.value) and getattr(err.value, "permanent", False)


def test_a_pod_replaced_or_gone_meanwhile_is_left_alone(api: KubeAPI, tmp_path: Path) -> None:
    """The eviction carries the pod's uid: a pod recreated under the same name between the
    actuator's read and its eviction is refused by the API server (409) and left alone; one
    deleted meanwhile (404) or never there is reported gone, not evicted."""
    node, job = _names()
    api.node(node)
    token = api.token_for(SA_NS, SA_NAME)

    class Raced(KubernetesBackend):
        def _before_pod_action(self, ns: str, pod: str) -> None:
            api.request("DELETE", f"/api/v1/namespaces/{ns}/pods/{pod}",
                        {"kind": "DeleteOptions", "apiVersion": "v1", "gracePeriodSeconds": 0})
            if pod.endswith("-0"):  # its controller recreated it at once
                api.pod(ns, pod, node, {"job": job})

    raced = Raced(_client(api, tmp_path, token))
    before = api.pod("ml", f"{job}-0", node, {"job": job})["metadata"]["uid"]
    api.pod("ml", f"{job}-1", node, {"job": job})
    said = raced.apply(_action(REQUEUE, node, job, pod=f"{job}-0", node=node))
    assert said == f"ml/{job}-0: replaced meanwhile: left alone", said
    now = api.get(f"/api/v1/namespaces/ml/pods/{job}-0")
    assert now["metadata"]["uid"] != before and not now["metadata"].get("deletionTimestamp")
    said = raced.apply(_action(REQUEUE, node, job, pod=f"{job}-1", node=node))
    assert said == f"ml/{job}-1: already gone", said
    assert not api.events_about("ml", "Pod", f"{job}-1")  # nothing claimed about it
    plain = _backend(api, tmp_path, token)
    said = plain.apply(_action(REQUEUE, node, job, pod=f"{job}-9", node=node))
    assert said == f"ml/{job}-9: already gone", said


def test_delete_instead_of_evict_needs_its_verb_and_overrides_the_budget(
        api: KubeAPI, tmp_path: Path) -> None:
    """--k8s-pod-action delete: refused (403, permanent) with the shipped role, which has no
    `delete`; with `delete` added as actuate-rbac.yaml says, the pod a budget protects from
    eviction (shown in the same run) is deleted."""
    node, job = _budgeted_pods(api, 1)
    requeue = _action(REQUEUE, node, job, pod=f"{job}-0", node=node)
    shipped = api.token_for(SA_NS, SA_NAME)
    with pytest.raises(ActuateError, match="refused \\(429\\)") as err:  # control: evict
        _backend(api, tmp_path, shipped).apply(requeue)
    assert not err.value.permanent  # the budget may allow it later: retried
    with pytest.raises(ActuateError, match="403") as err:
        _backend(api, tmp_path, shipped, pod_action="delete").apply(requeue)
    assert err.value.permanent
    role = f"fw-delete-{uuid.uuid4().hex[:6]}"
    rules = rules_of(load_docs(RBAC))
    for r in rules:
        if r["resources"] == ["pods"]:
            r["verbs"] = [*r["verbs"], "delete"]
    _bind(api, role, rules)
    deleter_token = api.token_for(SA_NS, role)
    deleter = _backend(api, tmp_path, deleter_token, pod_action="delete")
    wait_until(lambda: _allows(api, deleter_token, "pods", "delete"), 30,
               f"{role} to be in force")
    said = deleter.apply(requeue)
    assert said == f"deleted pod ml/{job}-0 on {node}", said
    pod = api.get(f"/api/v1/namespaces/ml/pods/{job}-0")  # no kubelet: left terminating
    assert pod["metadata"].get("deletionTimestamp"), pod["metadata"]
    assert [e["reason"] for e in api.events_about("ml", "Pod", f"{job}-0")] == [
        "FaultwatchRequeue"]


def _bind(api: KubeAPI, role: str, rules: list[dict[str, Any]]) -> None:
    """A ClusterRole with `rules` bound to a service account of the same name."""
    api.ensure({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole",
                "metadata": {"name": role}, "rules": rules})
    api.ensure({"apiVersion": "rbac.authorization.k8s.io/v1",
                "kind": "ClusterRoleBinding", "metadata": {"name": role},
                "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole",
                            "name": role},
                "subjects": [{"kind": "ServiceAccount", "name": role, "namespace": SA_NS}]})


def _allows(api: KubeAPI, token: str, resource: str, verb: str) -> bool:
    review = api.request("POST", "/apis/authorization.k8s.io/v1/selfsubjectrulesreviews",
                         {"apiVersion": "authorization.k8s.io/v1",
                          "kind": "SelfSubjectRulesReview", "spec": {"namespace": "ml"}},
                         token=token)
    return any(resource in r.get("resources", []) and verb in r.get("verbs", [])
               for r in review["status"]["resourceRules"])


# What each rule of the shipped ClusterRole is for: the action that must fail without it.
NEEDS = {
    ("nodes", "get"): "quarantine",
    ("nodes", "patch"): "quarantine",
    ("pods", "get"): "requeue",
    ("pods", "list"): "requeue-selector",
    ("pods/eviction", "create"): "requeue",
    ("events", "create"): "event",
}


def test_every_rule_of_the_shipped_role_is_needed(api: KubeAPI, tmp_path: Path) -> None:
    docs = load_docs(RBAC)
    rules = rules_of(docs)
    shipped = {(res, verb) for r in rules for res in r["resources"] for verb in r["verbs"]}
    assert shipped == set(NEEDS), "a rule no action needs, or an action without its rule"
    for res, verb in sorted(shipped):
        role = f"fw-less-{uuid.uuid4().hex[:6]}"
        less = []
        for r in copy.deepcopy(rules):
            r["verbs"] = [v for v in r["verbs"] if not (v == verb and res in r["resources"])]
            if r["verbs"]:
                less.append(r)
        _bind(api, role, less)
        token = api.token_for(SA_NS, role)
        backend = _backend(api, tmp_path, token, pod_selector="job={job}")
        node, job = _names()
        api.node(node)
        api.pod("ml", f"{job}-0", node, {"job": job})
        need = NEEDS[(res, verb)]
        # RBAC caches refresh within a second or two of a new binding: wait for the positive
        # side (the same account can do what the reduced role still allows) first
        wait_until(lambda t=token: _bound(api, t), 30,  # type: ignore[misc]
                   f"{role} to be in force")
        # a 403 is permanent: reported once with its cause, not retried (the runner's side:
        # test_actuate_limits.py::test_a_permanent_error_is_reported_once_and_a_refused_...)
        if need == "quarantine":
            with pytest.raises(ActuateError, match="403") as err:
                backend.apply(_action(QUARANTINE, node, job))
            assert err.value.permanent, err.value
        elif need == "event":
            said = backend.apply(_action(QUARANTINE, node, job))
            assert "tainted" in said and "event not posted" in said and "403" in said, said
        elif need == "requeue-selector":
            with pytest.raises(ActuateError, match="403") as err:  # only the selector lists
                backend.apply(_action(REQUEUE, node, job, namespace="ml"))
            assert err.value.permanent, err.value
        else:
            with pytest.raises(ActuateError, match="403") as err:
                backend.apply(_action(REQUEUE, node, job, pod=f"{job}-0", node=node))
            assert err.value.permanent, err.value


def _bound(api: KubeAPI, token: str) -> bool:
    """Whether the account's (reduced) role is in force yet: its rules review lists them."""
    review = api.request("POST", "/apis/authorization.k8s.io/v1/selfsubjectrulesreviews",
                         {"apiVersion": "authorization.k8s.io/v1",
                          "kind": "SelfSubjectRulesReview", "spec": {"namespace": "ml"}},
                         token=token)
    ours = {res for res, _ in NEEDS}
    return any(ours & set(r.get("resources", [])) for r in review["status"]["resourceRules"])


# The CRDs deploy/ uses that the API server does not serve by itself, exactly as KEDA
# publishes them (config/crd/bases of its Go module, fetched by scripts/k8s-api.sh crds): the
# dry run below validates the ScaledObject and TriggerAuthentication against KEDA's schema.
KEDA_KINDS = {"ScaledObject", "TriggerAuthentication"}


def _register_published_crds(api: KubeAPI) -> None:
    crds = [d for path in k8s.published_crds() for d in load_docs(path)]
    assert {c["spec"]["names"]["kind"] for c in crds} == KEDA_KINDS, crds
    for crd in crds:
        assert crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]
        api.ensure(crd)
    wait_until(lambda: _serves(api, "keda.sh/v1alpha1"), 60, "the KEDA CRDs to be served")


def _serves(api: KubeAPI, group_version: str) -> bool:
    try:
        kinds = {r["kind"] for r in api.get(f"/apis/{group_version}")["resources"]}
    except ApiError:
        return False
    return KEDA_KINDS <= kinds


def _manifests() -> list[tuple[str, dict[str, Any]]]:
    out = []
    for path in sorted(DEPLOY.glob("*.yaml")):
        for doc in load_docs(path):
            if "apiVersion" not in doc:  # a fragment to merge into a pod template
                doc = {"apiVersion": "v1", "kind": "Pod",
                       "metadata": {"name": "snippet", "namespace": "ml"},
                       "spec": {"containers": doc["containers"],
                                "volumes": doc.get("volumes", [])}}
            out.append((path.name, doc))
    return out


def test_every_manifest_in_deploy_passes_a_server_side_dry_run(api: KubeAPI) -> None:
    _register_published_crds(api)
    docs = _manifests()
    names = {d["kind"] for _, d in docs}
    assert {"Deployment", "ClusterRole", "ScaledObject", "Job", "Pod"} <= names, names
    for _, doc in docs:  # namespaces first, for real: a dry run creates nothing
        if doc["kind"] == "Namespace":
            api.ensure(doc)
    defined = {(d["kind"], d["metadata"]["name"]) for _, d in docs}
    problems = []
    for name, doc in docs:
        for trig in (doc.get("spec") or {}).get("triggers", []) if \
                doc["kind"] == "ScaledObject" else []:
            ref = (trig.get("authenticationRef") or {}).get("name")
            if ref and ("TriggerAuthentication", ref) not in defined:
                problems.append(f"{name}: ScaledObject names TriggerAuthentication {ref!r}, "
                                "which deploy/ does not define")
        try:
            api.create(doc, dry_run=True)
        except ApiError as e:
            if e.code != 409:  # 409: exists already (applied by the fixture)
                msg = e.body.get("message") if isinstance(e.body, dict) else e.body
                problems.append(f"{name}: {doc['kind']} {doc['metadata'].get('name')}: "
                                f"{e.code} {msg}")
    assert not problems, "\n".join(problems)
    # the dry run can fail: KEDA's schema refuses a ScaledObject with a misspelt field or a
    # count that is not a number (an open stand-in schema would take both)
    (scaled,) = [d for _, d in docs if d["kind"] == "ScaledObject"]
    for bad in ({"maxReplicas": 12}, {"minReplicaCount": "two"}):
        wrong = copy.deepcopy(scaled)
        wrong["spec"].update(bad)
        with pytest.raises(ApiError) as err:
            api.create(wrong, dry_run=True)
        assert err.value.code in (400, 422), err.value


def _documented_pod_failure_policy_job() -> dict[str, Any]:
    """The Job spec docs/schedulers.md recommends (its exit-code section's YAML block), with
    the one container its rules name."""
    text = (REPO / "docs" / "schedulers.md").read_text()
    blocks = [b.split("```", 1)[0] for b in text.split("```yaml")[1:]]
    (block,) = [b for b in blocks if "onExitCodes" in b]
    spec = yaml.safe_load(textwrap.dedent(block))["spec"]
    names = {r["onExitCodes"]["containerName"] for r in spec["podFailurePolicy"]["rules"]
             if "onExitCodes" in r}
    (container,) = names
    spec["template"]["spec"]["containers"] = [{"name": container, "image": "train:1"}]
    return {"apiVersion": "batch/v1", "kind": "Job",
            "metadata": {"name": "documented", "namespace": "ml"}, "spec": spec}


def test_the_documented_job_with_its_pod_failure_policy_is_accepted(api: KubeAPI) -> None:
    """docs/schedulers.md's podFailurePolicy and deploy/'s Job carrying it are both created for
    real (the API validates the policy on create) and act on exactly the exit codes of the
    agent's contract: Ignore 75 and 138, FailJob 1-9 (ours), 76, 78, 77 left to Count."""
    (shipped,) = [d for _, d in _manifests() if d["kind"] == "Job"]
    for job in (_documented_pod_failure_policy_job(), copy.deepcopy(shipped)):
        job["metadata"]["name"] = f"fw-{uuid.uuid4().hex[:6]}"
        job["metadata"]["namespace"] = "ml"
        created = api.create(job)  # for real, not a dry run
        spec = created["spec"]
        assert spec["template"]["spec"]["restartPolicy"] == "Never"
        rules = spec["podFailurePolicy"]["rules"]
        by_action: dict[str, set[int]] = {}
        for r in rules:
            if "onExitCodes" in r:
                assert r["onExitCodes"]["operator"] == "In", r
                by_action.setdefault(r["action"], set()).update(r["onExitCodes"]["values"])
        assert by_action == {
            "Ignore": {exitcodes.EXIT_RESTART, exitcodes.EXIT_ELSEWHERE},
            "FailJob": {*range(1, 10), exitcodes.EXIT_NODES_TIMEOUT, exitcodes.EXIT_FAILED},
        }, rules
        assert exitcodes.EXIT_UNDECIDED not in set().union(*by_action.values())  # Count
        assert {"action": "Ignore", "onPodConditions": [
            {"type": "DisruptionTarget", "status": "True"}]} in rules, rules
        # the agent's identity read through the downward API from the pod's labels (the run id
        # from controller-uid, the job from job-name): labels the API server sets on the template
        labels = spec["template"]["metadata"]["labels"]
        for c in spec["template"]["spec"]["containers"]:
            for env in c.get("env", []):
                path = ((env.get("valueFrom") or {}).get("fieldRef") or {}).get("fieldPath", "")
                if path.startswith("metadata.labels["):
                    assert path[len("metadata.labels['"):-2] in labels, (env, labels)
    # the API refuses what it must: a podFailurePolicy needs restartPolicy Never
    wrong = _documented_pod_failure_policy_job()
    wrong["metadata"]["name"] = f"fw-{uuid.uuid4().hex[:6]}"
    wrong["spec"]["template"]["spec"]["restartPolicy"] = "OnFailure"
    with pytest.raises(ApiError) as err:
        api.create(wrong, dry_run=True)
    assert err.value.code == 422 and "podFailurePolicy" in str(err.value.body), err.value


def _job_pods(api: KubeAPI, ns: str, job: str) -> list[dict[str, Any]]:
    return list(api.get(f"/api/v1/namespaces/{ns}/pods?labelSelector=job-name%3D{job}")["items"])


def _end_pod(api: KubeAPI, pod: dict[str, Any], code: int) -> None:
    """What a kubelet reports when the container `trainer` (the agent) exits with `code`."""
    ns, name = pod["metadata"]["namespace"], pod["metadata"]["name"]
    api.request("PATCH", f"/api/v1/namespaces/{ns}/pods/{name}/status", {"status": {
        "phase": "Failed", "containerStatuses": [{
            "name": "trainer", "ready": False, "restartCount": 0, "image": "train:1",
            "imageID": "", "state": {"terminated": {
                "exitCode": code, "reason": "Error", "startedAt": "2026-01-01T00:00:00Z",
                "finishedAt": "2026-01-01T00:01:00Z"}}}]}},
        content_type="application/merge-patch+json")


def test_the_job_controller_applies_the_documented_policy_to_each_verdict(
        api: KubeAPI) -> None:
    """The Kubernetes column of docs/schedulers.md#exit-codes, by the real Job controller on
    deploy/kubernetes/training-job.yaml: no kubelet runs here, so the test reports each pod's
    end as a kubelet would (container `trainer` terminated with the agent's code). 138 (run
    me elsewhere) and 75 (restart here) are ignored: a new pod, not counted against
    backoffLimit; 77 (undecided) is counted; 78 (failed) fails the Job at once."""
    from faultwatch.agents.exitcodes import (
        EXIT_ELSEWHERE,
        EXIT_FAILED,
        EXIT_RESTART,
        EXIT_UNDECIDED,
    )

    (job,) = [d for _, d in _manifests() if d["kind"] == "Job"]
    job = copy.deepcopy(job)
    name = job["metadata"]["name"] = f"fw-{uuid.uuid4().hex[:6]}"
    ns = job["metadata"]["namespace"] = "ml"
    api.create(job)
    path = f"/apis/batch/v1/namespaces/{ns}/jobs/{name}"
    ended: set[str] = set()
    for code, counted in ((EXIT_ELSEWHERE, 0), (EXIT_RESTART, 0), (EXIT_UNDECIDED, 1)):
        (pod,) = wait_until(lambda: [p for p in _job_pods(api, ns, name)
                                     if p["metadata"]["name"] not in ended
                                     and not p["metadata"].get("deletionTimestamp")] or None,
                            60, "the Job controller's next pod")
        _end_pod(api, pod, code)
        ended.add(pod["metadata"]["name"])
        # a replacement pod comes (positive control: the controller saw this end) ...
        wait_until(lambda: [p for p in _job_pods(api, ns, name)
                            if p["metadata"]["name"] not in ended], 60,
                   f"a new pod after exit {code}")
        status = _accounted(api, path, ns, pod["metadata"]["name"])
        # ... and only 77 counts against backoffLimit (Ignore vs the default Count)
        assert status.get("failed", 0) == counted, (code, status)
        assert not [c for c in status.get("conditions", []) if c["type"] == "Failed"], status
    (pod,) = [p for p in _job_pods(api, ns, name) if p["metadata"]["name"] not in ended]
    _end_pod(api, pod, EXIT_FAILED)
    failed = wait_until(lambda: [c for c in api.get(path)["status"].get("conditions", [])
                                 if c["type"] == "Failed" and c["status"] == "True"], 60,
                        "the Job failed by its podFailurePolicy")
    assert failed[0]["reason"] == "PodFailurePolicy", failed
    assert f"exit code {EXIT_FAILED}" in failed[0].get("message", ""), failed


def _accounted(api: KubeAPI, path: str, ns: str, pod: str) -> dict[str, Any]:
    """The Job's status once its controller has accounted for the ended pod: the pod's
    job-tracking finalizer removed and no terminated pod left uncounted (the replacement pod
    can be created before the status is written)."""
    def done() -> dict[str, Any] | None:
        try:
            fin = api.get(f"/api/v1/namespaces/{ns}/pods/{pod}")["metadata"].get(
                "finalizers") or []
        except ApiError as e:
            if e.code != 404:
                raise
            fin = []
        status: dict[str, Any] = api.get(path)["status"]
        uncounted = status.get("uncountedTerminatedPods") or {}
        if "batch.kubernetes.io/job-tracking" in fin or any(uncounted.values()):
            return None
        return status

    return wait_until(done, 60, f"the Job controller to account for pod {pod}")


@pytest.mark.kafka
def test_actuate_taints_a_quarantined_node_and_expiry_removes_the_taint(
        api: KubeAPI, kafka_bootstrap: str, topic_prefix: str, tmp_path: Path) -> None:
    """`faultwatch actuate --backend kubernetes` on the real broker and API server: a manual
    quarantine of 6 s (the nodes topic) cordons and taints the node; its expiry undoes it."""
    import asyncio
    import os
    import signal
    import subprocess
    import sys

    from faultwatch.kafka.admin import ensure_topics
    from faultwatch.wire.topics import Topics

    asyncio.run(ensure_topics(kafka_bootstrap, Topics(topic_prefix), 1))
    node, _ = _names()
    api.node(node)
    kubeconfig = api.kubeconfig(tmp_path / "kubeconfig", token=api.token_for(SA_NS, SA_NAME))
    env = dict(os.environ, FAULTWATCH_BOOTSTRAP=kafka_bootstrap,
               FAULTWATCH_TOPIC_PREFIX=topic_prefix,
               FAULTWATCH_DECISION_KEY="k1:0123456789abcdef0123456789")
    state = ["--state-file", str(tmp_path / "state.jsonl")]
    wrong = subprocess.run(  # a context the file does not have: exit 2 at start, saying so
        [sys.executable, "-m", "faultwatch", "actuate", "--backend", "kubernetes",
         "--kubeconfig", str(kubeconfig), "--context", "absent", *state],
        env=env, capture_output=True, text=True, timeout=60)
    assert wrong.returncode == 2 and "absent" in wrong.stderr, wrong.stderr
    log = tmp_path / "actuate.log"
    with open(log, "wb") as fh:  # the kubeconfig from $KUBECONFIG, as kubectl finds it
        proc = subprocess.Popen(
            [sys.executable, "-m", "faultwatch", "actuate", "--backend", "kubernetes", *state],
            stdout=fh, stderr=subprocess.STDOUT, env={**env, "KUBECONFIG": str(kubeconfig)},
            start_new_session=True)
    try:
        def taints() -> set[str]:
            assert proc.poll() is None, log.read_text()
            return {t["key"] for t in api.get(f"/api/v1/nodes/{node}")["spec"].get("taints", [])}

        subprocess.run([sys.executable, "-m", "faultwatch", "nodes", "quarantine", node,
                        "--for", "6s", "--reason", "suspected bad HBM"], env=env, check=True,
                       capture_output=True, timeout=60)
        wait_until(lambda: TAINT_KEY in taints(), 60, "actuate to taint the node")
        obj = api.get(f"/api/v1/nodes/{node}")
        assert obj["spec"]["unschedulable"] is True
        assert "decision manual-" in obj["metadata"]["annotations"][REASON_ANNOTATION]
        wait_until(lambda: TAINT_KEY not in taints(), 60, "the expiry to remove the taint")
        assert not api.get(f"/api/v1/nodes/{node}")["spec"].get("unschedulable")
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGTERM)
            proc.wait(20)


def test_actuate_taints_a_node_for_a_job_only_where_its_pod_runs(
        api: KubeAPI, actuator: KubernetesBackend, tmp_path: Path) -> None:
    """Issue 28: before tainting a node for a job, actuate asks the API server whether the
    run's pod (spec.nodeName), or a pod of --k8s-pod-selector, is on that node, with the
    shipped service account; a blacklist naming a node the job does not run on is refused
    (not_allocated, counted) and the node is left alone, the true one is tainted."""
    import time

    from faultwatch.actuate.confirm import confirm
    from faultwatch.actuate.journal import Journal
    from faultwatch.actuate.runner import ActuateConfig, Actuator
    from faultwatch.core.events import Decision
    from faultwatch.metrics import REFUSALS

    node, job = _names()
    elsewhere = node + "-other"
    api.node(node)
    api.node(elsewhere)
    api.pod("ml", f"{job}-0", node, {"job": job})
    # by the run's pod name (spec.nodeName), by the selector, and no identity at all
    assert confirm(actuator, _action(QUARANTINE, node, job, pod=f"{job}-0")) is None
    why = confirm(actuator, _action(QUARANTINE, elsewhere, job, pod=f"{job}-0"))
    assert why == f"pod ml/{job}-0 runs on {node}, not {elsewhere}"
    assert "does not exist" in (confirm(actuator, _action(QUARANTINE, node, job,
                                                          pod=f"{job}-gone")) or "")
    assert confirm(actuator, _action(QUARANTINE, node, job, node=node)) is None
    assert f"no pod of '{job}' (job={job}) on {elsewhere}" in (
        confirm(actuator, _action(QUARANTINE, elsewhere, job, node=elsewhere)) or "")
    assert "no Kubernetes identity" in (confirm(actuator, _action(QUARANTINE, node, job)) or "")

    # the runner: a blacklist of the wrong node is refused, of the right one carried out
    act = Actuator(actuator, Journal(tmp_path / "journal"),
                   ActuateConfig("127.0.0.1:1", "p.", tmp_path / "journal", "g",
                                 fleet_nodes=100))
    now = time.time()
    before = REFUSALS[("actuate", "not_allocated")]
    for did, on in (("d-wrong", elsewhere), ("d-right", node)):
        act.on_decision(Decision(id=did, job=job, attempt=0, action="blacklist", kind="error",
                                 ts=now, nodes=(on,), rule="nvidia-xid-79", run_id="r1",
                                 scheduler={"kind": "kubernetes", "namespace": "ml",
                                            "pod": f"{job}-0"}), now, did)
        act.run_due(now)
    assert REFUSALS[("actuate", "not_allocated")] == before + 1

    def tainted(n: str) -> bool:
        return TAINT_KEY in {t["key"] for t in api.get(f"/api/v1/nodes/{n}")["spec"]
                             .get("taints", [])}

    assert tainted(node)  # the positive control
    assert not tainted(elsewhere)
    assert not api.get(f"/api/v1/nodes/{elsewhere}")["spec"].get("unschedulable")


def test_the_processor_asks_the_api_server_which_nodes_a_job_holds(
        api: KubeAPI, actuator: KubernetesBackend) -> None:
    """Issue 35 item 1: `process --allocation-check kubernetes` lists the pods of the run's
    Job uid (its controller-uid label) in the namespace: the nodes they are bound to and
    their names (a finished pod holds nothing); without a uid, the one named pod. Asked with
    the read-only pod verbs of the shipped role."""
    from faultwatch.streams.allocations import kubernetes_asker

    node, job = _names()
    uid = str(uuid.uuid4())
    api.node(node)
    api.node(node + "-b")
    api.pod("ml", f"{job}-0", node, {"batch.kubernetes.io/controller-uid": uid})
    api.pod("ml", f"{job}-1", node + "-b", {"batch.kubernetes.io/controller-uid": uid})
    api.pod("ml", f"{job}-old", node + "-c", {"controller-uid": str(uuid.uuid4())})
    ask = kubernetes_asker(actuator)
    assert ask(f"kubernetes:ml/{uid}") == {node, node + "-b", f"{job}-0", f"{job}-1"}
    assert ask(f"kubernetes:ml/pod/{job}-0") == {node, f"{job}-0"}
    assert ask(f"kubernetes:ml/{uuid.uuid4()}") == frozenset()
    assert ask("kubernetes:ml/pod/nobody") == frozenset()
    api.request("PATCH", f"/api/v1/namespaces/ml/pods/{job}-1/status",
                {"status": {"phase": "Failed"}}, content_type="application/merge-patch+json")
    assert ask(f"kubernetes:ml/{uid}") == {node, f"{job}-0"}


def test_kubeflows_own_rule_retries_exactly_the_verdicts_docs_schedulers_says() -> None:
    """The Kubeflow column of docs/schedulers.md's exit-code table, decided by the
    training-operator's own code (no operator can run pods here: no kubelet): only "run me
    elsewhere" (138) and the agent's own stop by a signal (128+N) are retried; every other
    verdict and faultwatch's own errors are permanent (tests/e2e/test_exit_contract.py proves
    the agent exits with these codes)."""
    why = k8s.missing()
    if why:
        pytest.skip(why)
    stops = {128 + int(s) for s in exitcodes.STOP_SIGNALS}
    own_errors = set(range(1, 7))
    verdicts = {exitcodes.EXIT_RESTART, exitcodes.EXIT_NODES_TIMEOUT, exitcodes.EXIT_UNDECIDED,
                exitcodes.EXIT_FAILED, exitcodes.EXIT_ELSEWHERE}
    retried = k8s.kubeflow_retries(sorted(verdicts | stops | own_errors))
    assert {c for c, r in retried.items() if r} == {exitcodes.EXIT_ELSEWHERE} | stops
    # the table says so too: its Kubeflow column per verdict row
    table = (Path(__file__).resolve().parents[2] / "docs" / "schedulers.md").read_text()
    rows = {int(r.split("|")[1].strip().split("/")[0]): r.split("|")[5].strip()
            for r in table.splitlines()
            if r.startswith("| ") and r.split("|")[1].strip().split("/")[0].isdigit()}
    for code in (exitcodes.EXIT_RESTART, exitcodes.EXIT_NODES_TIMEOUT, exitcodes.EXIT_UNDECIDED,
                 exitcodes.EXIT_FAILED):
        assert "permanent" in rows[code], (code, rows[code])
    assert rows[exitcodes.EXIT_ELSEWHERE].startswith("retryable"), rows[exitcodes.EXIT_ELSEWHERE]
    assert rows[129].startswith("retryable"), rows[129]
