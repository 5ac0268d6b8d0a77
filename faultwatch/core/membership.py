"""Which nodes may speak for a job run: the scheduler's allocation, where the processor can ask
the scheduler (pure: the answers are passed in).

A node's key proves which node wrote a record, not that the job runs there; like a kubelet
under Kubernetes' NodeRestriction, a node may only touch a run the scheduler placed on it.
The shell asks the scheduler for the allocation a run-start names (`allocation_key`: a Slurm
job id, or a Kubernetes Job uid / pod) and passes the answers in: key -> the node names the
job holds now (empty: it holds none, or the scheduler does not know it). Without an answer
(no scheduler configured, or it could not be asked) the run is unchecked and the run id
rules alone apply (core/runs.py).

A run whose allocation was answered keeps it (`JobState.allocation`, durable): from then on
every record of a node outside it is refused (`not-allocated`), a run-start of the same
scheduler job refreshes it (a Slurm requeue or a rescheduled pod lands on other nodes), and
while the run is running another run replaces it only from one of its nodes or once the
scheduler says it holds none (a node cannot take over a job name the scheduler runs
elsewhere: Kubernetes refuses a second object of one name the same way).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from faultwatch.core.pmap import PMap

ASK_TIMEOUT_S = 10.0  # one question to the scheduler (`process --allocation-timeout-s`)

NOT_ALLOCATED = "not-allocated"  # the node is not in the run's allocation
NAME_IN_USE = "name-in-use"  # another run's node, while the scheduler runs this one elsewhere

Allocations = Mapping[str, frozenset[str]]
NO_ANSWERS: Allocations = {}
Scheduler = Mapping[str, Any] | PMap[str, Any]  # a run-start's, or a state's frozen one


def allocation_key(scheduler: Scheduler) -> str | None:
    """The scheduler job whose allocation a run-start names: `slurm:<job id>`,
    `kubernetes:<namespace>/<Job uid>` or `kubernetes:<namespace>/pod/<pod>`; None when
    the scheduler identity names none."""
    kind = scheduler.get("kind")
    if kind == "slurm" and scheduler.get("job_id"):
        return f"slurm:{scheduler['job_id']}"
    if kind == "kubernetes" and scheduler.get("namespace"):
        if scheduler.get("uid"):
            return f"kubernetes:{scheduler['namespace']}/{scheduler['uid']}"
        if scheduler.get("pod"):
            return f"kubernetes:{scheduler['namespace']}/pod/{scheduler['pod']}"
    return None


def answer_for(scheduler: Scheduler, answers: Allocations) -> frozenset[str] | None:
    """The scheduler's answer for the job `scheduler` names, None when there is none."""
    key = allocation_key(scheduler)
    return None if key is None else answers.get(key)


def holds(allocation: frozenset[str] | None, node: str) -> bool:
    """`node` may speak for a run with this allocation (None: unchecked, anyone may)."""
    return allocation is None or node in allocation
