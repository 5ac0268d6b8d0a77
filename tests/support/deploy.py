"""deploy/'s shipped configuration as local processes: a container of a Kubernetes manifest, a
systemd unit or a batch script's `faultwatch` line becomes (argv, env) whose paths point into
a temporary directory, the way a kubelet or systemd would lay them out.

Kubernetes: each volumeMount is materialized under `root` (Secrets and ConfigMaps from the
data the test gives, with their `defaultMode`; hostPath files copied from the test's files;
emptyDir and persistent volumes as empty directories), the environment is built as the
kubelet builds it (`value` with `$(VAR)` references, `fieldRef` from the pod's fields the
test gives, `secretKeyRef`/`configMapKeyRef`), and every string that names a mount path is
rewritten to the materialized path. systemd and batch scripts: `Environment=` / `export`
lines, and every /etc/faultwatch, /var/lib/faultwatch, /shared path rewritten under `root`.

What is not the manifest's: the broker address (the test's secure broker; the manifests'
placeholder host is not resolvable here) and fixed ports (metrics ports become 0), which
`Launch.bootstrap` and `free_ports` replace. Nothing else is added or dropped; a test that
needs an attacker's variant (no key) edits the Launch it got and says so."""

from __future__ import annotations

import os
import re
import shlex
import shutil
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

REPO = Path(__file__).resolve().parents[2]
DEPLOY = REPO / "deploy"
_REF = re.compile(r"\$\((\w+)\)")


@dataclass
class Launch:
    """One shipped process: `argv` after the `faultwatch` program, its environment."""

    where: str
    argv: list[str]
    env: dict[str, str]
    mounts: dict[str, Path] = field(default_factory=dict)  # shipped path -> local path

    def local(self, shipped: str) -> Path:
        """The local file a shipped path was mapped to."""
        return Path(_map(shipped, self.mounts))

    def with_bootstrap(self, bootstrap: str) -> Launch:
        env = dict(self.env, FAULTWATCH_BOOTSTRAP=bootstrap)
        return Launch(self.where, list(self.argv), env, dict(self.mounts))

    def expand(self, variables: Mapping[str, str]) -> Launch:
        """Shell variables of a batch script's words ($SLURM_JOB_NAME) from `variables`."""
        argv = [re.sub(r"\$\{?(\w+)\}?", lambda m: variables[m.group(1)], a)
                for a in self.argv]
        return Launch(self.where, argv, dict(self.env), dict(self.mounts))

    def free_ports(self) -> Launch:
        """Fixed metrics ports -> 0 (another process of the suite may hold 9400)."""
        argv = list(self.argv)
        for i, a in enumerate(argv[:-1]):
            if a == "--metrics-port":
                argv[i + 1] = "0"
        return Launch(self.where, argv, dict(self.env), dict(self.mounts))


def _map(text: str, mounts: Mapping[str, Path]) -> str:
    for shipped in sorted(mounts, key=len, reverse=True):
        if text == shipped or text.startswith(shipped.rstrip("/") + "/"):
            return str(mounts[shipped]) + text[len(shipped):]
        text = text.replace(f"={shipped}", f"={mounts[shipped]}")
    return text


def docs(name: str) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all((DEPLOY / "kubernetes" / name).read_text()) if d]


def pod_spec(doc: dict[str, Any]) -> dict[str, Any]:
    """The pod spec of a Deployment/Job, or of a fragment to merge into one."""
    if "containers" in doc:
        return doc
    spec = doc["spec"]
    return spec["template"]["spec"] if "template" in spec else spec


@dataclass
class Kubelet:
    """Lays out a container's volumes under `root` and builds its environment."""

    root: Path
    secrets: dict[str, dict[str, bytes]]
    configmaps: dict[str, dict[str, str]]
    host_files: dict[str, Path]

    def launch(self, manifest: str, container: str, fields: Mapping[str, str],
               workload: str = "") -> Launch:
        """The container named `container` of `manifest` (the document named `workload`,
        or the first with such a container); `fields` are the downward API's values
        (`spec.nodeName`, `metadata.name`, `metadata.labels['job-name']`...)."""
        for doc in docs(manifest):
            if workload and (doc.get("metadata") or {}).get("name") != workload:
                continue
            spec = pod_spec(doc)
            for c in spec.get("containers", []):
                if c["name"] == container:
                    return self._launch(f"{manifest}:{c['name']}", spec, c, fields)
        raise KeyError(f"no container {container!r} in deploy/kubernetes/{manifest}")

    def _launch(self, where: str, spec: dict[str, Any], c: dict[str, Any],
                fields: Mapping[str, str]) -> Launch:
        base = self.root / re.sub(r"\W+", "-", where)
        volumes = {v["name"]: v for v in spec.get("volumes", [])}
        mounts: dict[str, Path] = {}
        for m in c.get("volumeMounts", []):
            local = base / m["mountPath"].lstrip("/")
            self._materialize(volumes[m["name"]], local)
            mounts[m["mountPath"]] = local
        env: dict[str, str] = {}
        for e in c.get("env", []):
            if "value" in e:
                env[e["name"]] = _REF.sub(lambda r: env.get(r.group(1), r.group(0)),
                                          str(e["value"]))
            else:
                env[e["name"]] = self._value_from(e["valueFrom"], fields)
        env = {k: _map(v, mounts) for k, v in env.items()}
        argv = [_REF.sub(lambda r: env.get(r.group(1), r.group(0)), str(a))
                for a in [*(c.get("command") or []), *(c.get("args") or [])]]
        if argv and argv[0] == "faultwatch":  # else the image's ENTRYPOINT is faultwatch
            argv = argv[1:]
        return Launch(where, [_map(a, mounts) for a in argv], env, mounts)

    def _value_from(self, src: dict[str, Any], fields: Mapping[str, str]) -> str:
        if "fieldRef" in src:
            return fields[src["fieldRef"]["fieldPath"]]
        if "secretKeyRef" in src:
            ref = src["secretKeyRef"]
            return self.secrets[ref["name"]][ref["key"]].decode()
        ref = src["configMapKeyRef"]
        return self.configmaps[ref["name"]][ref["key"]]

    def _materialize(self, vol: dict[str, Any], local: Path) -> None:
        if "secret" in vol or "configMap" in vol:
            src = vol.get("secret") or vol["configMap"]
            name = src.get("secretName") or src["name"]
            data = ({k: v for k, v in self.secrets[name].items()} if "secret" in vol
                    else {k: v.encode() for k, v in self.configmaps[name].items()})
            local.mkdir(parents=True, exist_ok=True)
            mode = src.get("defaultMode", 0o644)
            for key, value in data.items():
                (local / key).write_bytes(value)
                os.chmod(local / key, mode)
        elif "hostPath" in vol:
            hp = vol["hostPath"]
            local.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(self.host_files[hp["path"]], local)
        else:  # emptyDir, a persistent volume claim
            local.mkdir(parents=True, exist_ok=True)


# ---- systemd units and batch scripts ------------------------------------------------------

SHIPPED_DIRS = ("/etc/faultwatch", "/var/lib/faultwatch", "/shared")


def unit(name: str, root: Path) -> Launch:
    """A systemd unit of deploy/slurm: its Environment= and ExecStart's faultwatch argv,
    /etc/faultwatch and /var/lib/faultwatch under `root`."""
    text = (DEPLOY / "slurm" / name).read_text()
    mounts = _dirs(root)
    env = {k: _map(v, mounts) for k, v in
           (line.split("=", 1) for line in re.findall(r"^Environment=(.*)$", text, re.M))}
    (line,) = re.findall(r"^ExecStart=(.*)$", text, re.M)
    words = shlex.split(line)
    assert words[0].endswith("/faultwatch"), words
    return Launch(f"slurm/{name}", [_map(w, mounts) for w in words[1:]], env, mounts)


def batch_agent(name: str, root: Path) -> Launch:
    """The exports of a batch script and its `faultwatch agent` flags up to `--` (the
    workload after it is the test's); shell variables are left for the caller's env."""
    text = (DEPLOY / "slurm" / name).read_text().replace("\\\n", " ")
    mounts = _dirs(root)
    env = {}
    for k, v in re.findall(r"^export (\w+)=(\S+)", text, re.M):
        env[k] = _map(v, mounts)
    (line,) = [ln for ln in text.splitlines() if " faultwatch agent " in ln]
    words = shlex.split(line, comments=True)
    argv = words[words.index("faultwatch") + 1:]
    return Launch(f"slurm/{name}", [_map(w, mounts) for w in argv[:argv.index("--")]],
                  env, mounts)


def _dirs(root: Path) -> dict[str, Path]:
    out = {}
    for d in SHIPPED_DIRS:
        out[d] = root / d.lstrip("/")
        out[d].mkdir(parents=True, exist_ok=True)
    return out
