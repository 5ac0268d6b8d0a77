"""The run identity of an agent: run id, where it came from, and the scheduler's identity.

A pure function of (flags, environment, wrapped command, a generated id). Sources of the
run id, first match wins:

| run_source   | from                                                                   |
| ------------ | ---------------------------------------------------------------------- |
| `flag`       | `--run-id` or `FAULTWATCH_RUN_ID`                                      |
| `slurm`      | `SLURM_ARRAY_JOB_ID`_`SLURM_ARRAY_TASK_ID` for array tasks, else `SLURM_JOB_ID` |
| `torchrun`   | `--rdzv-id`/`--rdzv_id` in the wrapped command, else `TORCHELASTIC_RUN_ID` |
| `kubernetes` | `FAULTWATCH_K8S_UID` (the downward API: a Job/pod-set uid or label)    |
| `rendezvous` | `rdzv-<hash>` of the job name and the launch's rendezvous endpoint, for a |
|              | multi-node launch without an id (rendezvous.py): the same on every node |
| `generated`  | `g-<uuid hex>`, one per agent process (stable across its attempts)     |

`shared(identity)` says whether every agent of a multi-node launch derives the same id; a
multi-node launch whose id is generated is the one the agent warns about (rendezvous.py).

The scheduler identity (`RunStart.scheduler`, copied into decisions) is filled from the
Slurm environment (`kind: slurm`, job_id, array_job_id, array_task_id, node from
SLURMD_NODENAME, job_name) or from the Kubernetes downward-API variables the pod spec sets
(`kind: kubernetes`: FAULTWATCH_K8S_NAMESPACE, _POD, _NODE, _UID), plus free `labels` from
`--label k=v`; `{}` when there is none.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

from faultwatch import settings
from faultwatch.agents.rendezvous import TORCHRUN_DEFAULT_RDZV_ID, derived_run_id, launch_of
from faultwatch.core.names import MAX_NAME_CHARS, name_problem
from faultwatch.errors import ConfigError

MAX_ID_CHARS = MAX_NAME_CHARS
FLAG, SLURM, TORCHRUN, KUBERNETES, RENDEZVOUS, GENERATED = (
    "flag", "slurm", "torchrun", "kubernetes", "rendezvous", "generated")
K8S_ENV = {"namespace": settings.K8S_NAMESPACE.name, "pod": settings.K8S_POD.name,
           "node": settings.K8S_NODE.name, "uid": settings.K8S_UID.name}


@dataclass(frozen=True)
class RunIdentity:
    run_id: str
    run_source: str
    scheduler: dict[str, object] = field(default_factory=dict)


def check_id(key: str, value: str) -> str:
    """value if it is a safe identity by the one name rule (core/names.py)."""
    problem = name_problem(value)
    if problem is not None:
        raise ConfigError(key, problem)
    return value


def parse_labels(items: Sequence[str]) -> dict[str, str]:
    """`k=v` strings (from --label) as a dict; ConfigError naming a malformed one."""
    out: dict[str, str] = {}
    for item in items:
        k, sep, v = item.partition("=")
        if not sep or not k.strip():
            raise ConfigError("label", f"expected KEY=VALUE, got {item!r}")
        out[check_id("label", k.strip())] = check_id("label", v) if v else ""
    return out


def rdzv_id_of(cmd: Sequence[str]) -> str | None:
    """torchrun's --rdzv-id / --rdzv_id in a wrapped command line (either `=` or a space)."""
    return launch_of(cmd, {}).rdzv_id


def _env(env: Mapping[str, str], name: str) -> str:
    return (env.get(name) or "").strip()


def scheduler_of(env: Mapping[str, str], labels: Mapping[str, str]) -> dict[str, object]:
    """The scheduler's identity of this job from the environment, plus free labels."""
    out: dict[str, object] = {}
    if _env(env, "SLURM_JOB_ID"):
        out["kind"] = "slurm"
        for key, name in (("job_id", "SLURM_JOB_ID"), ("array_job_id", "SLURM_ARRAY_JOB_ID"),
                          ("array_task_id", "SLURM_ARRAY_TASK_ID"),
                          ("node", "SLURMD_NODENAME"), ("job_name", "SLURM_JOB_NAME")):
            if _env(env, name):
                out[key] = check_id(name, _env(env, name))
    elif any(_env(env, name) for name in K8S_ENV.values()):
        out["kind"] = "kubernetes"
        for key, name in K8S_ENV.items():
            if _env(env, name):
                out[key] = check_id(name, _env(env, name))
    if labels:
        out["labels"] = dict(labels)
    return out


def resolve_identity(run_id_flag: str | None, labels: Sequence[str], env: Mapping[str, str],
                     cmd: Sequence[str], generate: Callable[[], str], job: str = ""
                     ) -> RunIdentity:
    """This agent's run identity (see the module docstring for the order of sources)."""
    scheduler = scheduler_of(env, parse_labels(labels))
    flag = (run_id_flag or "").strip() or _env(env, settings.RUN_ID.name)
    if flag:
        return RunIdentity(check_id("run_id", flag), FLAG, scheduler)
    array_job, array_task = _env(env, "SLURM_ARRAY_JOB_ID"), _env(env, "SLURM_ARRAY_TASK_ID")
    if array_job and array_task:
        return RunIdentity(check_id("SLURM_ARRAY_JOB_ID", f"{array_job}_{array_task}"), SLURM,
                           scheduler)
    if _env(env, "SLURM_JOB_ID"):
        return RunIdentity(check_id("SLURM_JOB_ID", _env(env, "SLURM_JOB_ID")), SLURM,
                           scheduler)
    launch = launch_of(cmd, env)
    for rdzv in (launch.rdzv_id, _env(env, "TORCHELASTIC_RUN_ID")):
        if rdzv and rdzv.strip() and rdzv.strip() != TORCHRUN_DEFAULT_RDZV_ID:
            return RunIdentity(check_id("rdzv_id", rdzv.strip()), TORCHRUN, scheduler)
    if _env(env, settings.K8S_UID.name):
        return RunIdentity(check_id(settings.K8S_UID.name, _env(env, settings.K8S_UID.name)),
                           KUBERNETES, scheduler)
    derived = derived_run_id(job, launch)
    if derived is not None:
        return RunIdentity(derived, RENDEZVOUS, scheduler)
    return RunIdentity(f"g-{generate()}", GENERATED, scheduler)
