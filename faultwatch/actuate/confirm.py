"""Before a node is drained or tainted for a job, ask the scheduler whether it runs that job
on that node (a decision can only be as true as what the agents told the processor).

    Slurm       the job's NodeList (`scontrol show job ID -o` expanded with `scontrol show
                hostnames`), by the decision's Slurm job id; without one, `squeue -w NODE
                -n JOB -t running` must list a job of that name on the node
    Kubernetes  the run's pod's spec.nodeName; without a pod name, a pod of
                --k8s-pod-selector (with {job}) on that node in the run's namespace
    exec        --exec-confirm ARGV: exit 0 yes, exit 1 no (anything else: an error, retried);
                without it nothing is confirmed (logged once: `allocation_unchecked`)

A quarantine with no job behind it (an operator's signed registry record, an expiry) needs no
confirmation. `confirm` returns None when the action may go ahead, else why it may not.
"""

from __future__ import annotations

import subprocess
import urllib.parse
from typing import Any

from faultwatch.actuate.backend import ActuateError
from faultwatch.actuate.plan import QUARANTINE, Action
from faultwatch.registry.names import (
    K8S_NAME_RE,
    K8S_NAMESPACE_RE,
    SLURM_JOB_ID_RE,
    check,
    valid_job,
)

CONFIRM = "confirm"  # the exec backend's template key


def needs_confirmation(action: Action) -> bool:
    return action.kind == QUARANTINE and bool(action.job)


def confirm(backend: Any, action: Action) -> str | None:
    """None: the scheduler runs action.job on action.node (or nothing to confirm); else the
    refusal. ActuateError when the scheduler could not be asked (retried like an action)."""
    if not needs_confirmation(action):
        return None
    kind = getattr(backend, "name", "")
    if kind == "slurm":
        return _slurm(backend, action)
    if kind == "kubernetes":
        return _kubernetes(backend, action)
    if kind == "exec":
        return _exec(backend, action)
    return None


def _slurm(b: Any, a: Action) -> str | None:
    sched = a.scheduler
    if sched.get("kind") == "slurm" and sched.get("job_id"):
        jid = check("job_id", sched["job_id"], SLURM_JOB_ID_RE)
        out = b._call([b.scontrol, "show", "job", jid, "-o"], ok_codes=(0, 1))  # noqa: SLF001
        from faultwatch.actuate.slurm import parse_show

        info = parse_show(out)
        hosts = b._hostnames(info.get("NodeList", "")) if info else []  # noqa: SLF001
        if a.node in hosts:
            return None
        return (f"Slurm job {jid} ({a.job}) does not run on {a.node} "
                f"(its nodes: {','.join(hosts) or 'none'})")
    name = valid_job(a.job)  # --name=: a name may start with "-" (one rule: wire's safe_name)
    out = b._call([b.squeue, "-h", "-t", "running", "-w", a.node, f"--name={name}",  # noqa: SLF001
                   "-o", "%i"])
    if out.split():
        return None
    return f"Slurm runs no job named {a.job!r} on {a.node}"


def _kubernetes(b: Any, a: Action) -> str | None:
    sched = a.scheduler
    if sched.get("kind") != "kubernetes" or not sched.get("namespace"):
        return f"no Kubernetes identity for job {a.job!r}: cannot confirm it runs on {a.node}"
    ns = check("namespace", sched["namespace"], K8S_NAMESPACE_RE)
    if sched.get("pod"):
        pod = check("pod", sched["pod"], K8S_NAME_RE)
        obj = b._request("GET", f"/api/v1/namespaces/{ns}/pods/{pod}", ok404=True)  # noqa: SLF001
        if obj is None:
            return f"pod {ns}/{pod} does not exist"
        on = (obj.get("spec") or {}).get("nodeName")
        return None if on == a.node else f"pod {ns}/{pod} runs on {on or 'no node'}, " \
                                         f"not {a.node}"
    if not b.pod_selector:
        return f"no pod name and no --k8s-pod-selector: cannot confirm {a.job!r} on {a.node}"
    sel = b.pod_selector.replace("{job}", a.job)
    q = urllib.parse.urlencode({"labelSelector": sel, "fieldSelector": f"spec.nodeName={a.node}"})
    listing = b._request("GET", f"/api/v1/namespaces/{ns}/pods?{q}") or {}  # noqa: SLF001
    if listing.get("items"):
        return None
    return f"no pod of {a.job!r} ({sel}) on {a.node} in {ns}"


def _exec(b: Any, a: Action) -> str | None:
    from faultwatch.actuate.exec import fill

    tpl = b.templates.get(CONFIRM)
    if tpl is None:
        if not getattr(b, "_warned_unchecked", False):
            b._warned_unchecked = True  # noqa: SLF001
            from faultwatch.eventlog import log_event

            log_event("allocation_unchecked", backend="exec",
                      hint="give --exec-confirm so a node is drained for a job only when the "
                           "scheduler runs that job there")
        return None
    argv = fill(tpl, a)
    if argv is None:
        return "the --exec-confirm template needs fields this decision lacks"
    try:
        r = b._run(argv, capture_output=True, text=True, timeout=b.timeout_s, check=False,  # noqa: SLF001
                   shell=False)
    except (OSError, subprocess.TimeoutExpired) as e:
        raise ActuateError(f"exec {argv[0]}: {e}") from None
    if r.returncode == 0:
        return None
    if r.returncode == 1:
        return f"{argv[0]} says {a.job!r} does not run on {a.node}"
    raise ActuateError(f"exec {argv[0]} exited {r.returncode}: {(r.stderr or '').strip()[:300]}")
