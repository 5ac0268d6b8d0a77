"""The scheduler's context of a launch (pure: texts and environment in): Slurm's job environment,
`scontrol show config` / slurm.conf (KillWait) and `scontrol show job` (TimeLimit); the
Kubernetes downward API.

Kubernetes' downward API does not expose `terminationGracePeriodSeconds`; the pod spec can
give it to the agent as FAULTWATCH_K8S_TERMINATION_GRACE_S (docs/timeouts.md). Without it,
or without scontrol and a readable slurm.conf, the grace is unknown: a cluster's own value,
not the scheduler's default, is what SIGKILLs the agent.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

from faultwatch import settings
from faultwatch.launch.defaults import default
from faultwatch.launch.model import DEFAULT, ENV, SCHEDULER, Setting, unknown

K8S_GRACE_ENV = settings.K8S_TERMINATION_GRACE_S.name
_KILL_WAIT_SHOW = re.compile(r"^\s*KillWait\s*=\s*(\d+)\s*sec", re.MULTILINE)
_KILL_WAIT_CONF = re.compile(r"^\s*KillWait\s*=\s*(\S+)", re.MULTILINE | re.IGNORECASE)
_INCLUDE_CONF = re.compile(r"^\s*include\s", re.MULTILINE | re.IGNORECASE)
_TIME_LIMIT = re.compile(r"\bTimeLimit=(\S+)")


@dataclass(frozen=True)
class Scheduler:
    """`kind`: slurm, kubernetes or none; `settings` by key (slurm.kill_wait_s,
    slurm.time_limit_s, k8s.termination_grace_s); `identity`: job id / pod, for the table."""

    kind: str = "none"
    settings: Mapping[str, Setting] = field(default_factory=lambda: MappingProxyType({}))
    identity: str = ""
    problems: tuple[str, ...] = ()

    def get(self, key: str) -> Setting | None:
        return self.settings.get(key)

    def to_dict(self) -> dict[str, Any]:
        return {"kind": self.kind, "identity": self.identity,
                "settings": {k: s.to_dict() for k, s in sorted(self.settings.items())},
                "problems": list(self.problems)}


def slurm_time_s(text: str) -> float | None:
    """A Slurm time ([days-]hours:minutes:seconds, minutes, ...; sbatch(1) --time) in
    seconds; None for UNLIMITED, Partition_Limit or anything else."""
    days = 0
    if "-" in text:
        d, _, text = text.partition("-")
        if not d.isdigit():
            return None
        days = int(d)
        parts = text.split(":")
        if not all(p.isdigit() for p in parts) or not 1 <= len(parts) <= 3:
            return None
        h, m, s = (parts + ["0", "0"])[:3]
        return days * 86400 + int(h) * 3600 + int(m) * 60 + int(s)
    parts = text.split(":")
    if not all(p.isdigit() for p in parts) or not 1 <= len(parts) <= 3:
        return None
    nums = [int(p) for p in parts]
    if len(nums) == 1:
        return nums[0] * 60.0  # minutes
    if len(nums) == 2:
        return nums[0] * 60.0 + nums[1]  # minutes:seconds
    return nums[0] * 3600.0 + nums[1] * 60 + nums[2]


def _kill_wait(show_config: str | None, conf_text: str | None, conf_path: str,
               problems: list[str]) -> Setting:
    key = "slurm.kill_wait_s"
    if show_config:
        m = _KILL_WAIT_SHOW.search(show_config)
        if m:
            return Setting(key, int(m.group(1)), SCHEDULER, "scontrol show config KillWait")
        problems.append("scontrol show config printed no KillWait")
    if conf_text is not None:
        m = _KILL_WAIT_CONF.search(conf_text)
        if m:
            if m.group(1).isdigit():
                return Setting(key, int(m.group(1)), SCHEDULER, f"{conf_path} KillWait")
            return unknown(key, f"{conf_path}: KillWait={m.group(1)!r} is not a number")
        if not _INCLUDE_CONF.search(conf_text):  # not set: Slurm's documented default
            d = default(key)
            return Setting(key, d.value, DEFAULT, f"{d.where} (not set in {conf_path})")
        return unknown(key, f"{conf_path} includes other files; scontrol not available")
    return unknown(key, "neither scontrol show config nor slurm.conf could be read")


def slurm(env: Mapping[str, str], show_config: str | None = None,
          show_job: str | None = None, conf_text: str | None = None,
          conf_path: str = "slurm.conf") -> Scheduler:
    """The Slurm context of a job step: SLURM_JOB_ID, KillWait, the job's TimeLimit."""
    problems: list[str] = []
    s: dict[str, Setting] = {"slurm.kill_wait_s": _kill_wait(show_config, conf_text,
                                                              conf_path, problems)}
    if show_job:
        m = _TIME_LIMIT.search(show_job)
        if m:
            t = slurm_time_s(m.group(1))
            s["slurm.time_limit_s"] = (Setting("slurm.time_limit_s", t, SCHEDULER,
                                               "scontrol show job TimeLimit")
                                       if t is not None else
                                       unknown("slurm.time_limit_s",
                                               f"TimeLimit={m.group(1)}"))
    job = env.get("SLURM_JOB_ID", "")
    return Scheduler("slurm", MappingProxyType(s), f"slurm job {job}", tuple(problems))


def kubernetes(env: Mapping[str, str]) -> Scheduler:
    """The Kubernetes context: the pod (downward API) and the grace the pod spec passes."""
    key = "k8s.termination_grace_s"
    problems: list[str] = []
    raw = env.get(K8S_GRACE_ENV)
    if raw is None:
        grace = unknown(key, "the downward API does not expose terminationGracePeriodSeconds: "
                             f"set {K8S_GRACE_ENV} in the pod spec to its value")
    else:
        try:
            grace = Setting(key, int(raw), ENV, K8S_GRACE_ENV)
        except ValueError:
            problems.append(f"{K8S_GRACE_ENV}={raw!r} is not an integer")
            grace = unknown(key, f"{K8S_GRACE_ENV}={raw!r} is not an integer")
    pod = settings.K8S_POD.raw(env) or env.get("HOSTNAME", "")
    ns = settings.K8S_NAMESPACE.raw(env) or ""
    return Scheduler("kubernetes", MappingProxyType({key: grace}),
                     f"pod {ns + '/' if ns else ''}{pod}", tuple(problems))


def detect(env: Mapping[str, str]) -> str:
    """slurm, kubernetes or none, from the job's environment."""
    if env.get("SLURM_JOB_ID"):
        return "slurm"
    if env.get("KUBERNETES_SERVICE_HOST") or settings.K8S_POD.raw(env) \
            or env.get(K8S_GRACE_ENV):
        return "kubernetes"
    return "none"
