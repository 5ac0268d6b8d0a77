"""Whether this agent starts active or as a hot spare, and where the launch meets (pure).

Every node of an allocation runs the same line (`srun faultwatch agent --spares K ... --
torchrun ...`, or the same pod template), so the role comes from the node's place in the
allocation, known before anything runs and the same on every restart of the agent: with M
nodes and K spares, nodes 0..M-K-1 are active and the last K wait as spares. Node 0, where
launch recipes put the rendezvous endpoint, is always active. The place is
`--node-index`/`--nodes-total`, else the scheduler's: Slurm's `SLURM_NODEID` of
`SLURM_STEP_NUM_NODES` (`SLURM_JOB_NUM_NODES` in a batch step), a Kubernetes Indexed Job's
`JOB_COMPLETION_INDEX` (its total from `--nodes-total` or `FAULTWATCH_NODES_TOTAL`: the pod
sees no completion count). `--spare` makes this agent a spare whatever its place (a second
`srun` step or a second Job for the spares).

Deciding roles by registration order instead (the first N agents to register are active, as
NVIDIA's ft_launcher admits standbys) would make the processor a launch dependency and the
roles differ between runs; a failed boot check on an active node is handled by the swap
itself (the blacklist it causes takes a spare).

The rendezvous host: torchrun's c10d backend keeps its store in the torchrun process on
the `--rdzv-endpoint` host (torch/distributed/elastic/rendezvous/c10d_rendezvous_backend.py:
the endpoint host serves it when its name or address is this machine's), so a job cannot
meet again without that node; an active agent tells the processor whether it is that node
(`hosts_rendezvous`) and the processor never swaps it out.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from faultwatch import settings
from faultwatch.errors import ConfigError


@dataclass(frozen=True)
class Role:
    """An agent's role: a spare waits without the command; `index`/`total` its place."""

    spare: bool
    index: int | None = None
    total: int | None = None
    why: str = ""


def _int(env: Mapping[str, str], *names: str) -> tuple[int | None, str]:
    for name in names:
        v = env.get(name, "").strip()
        if v:
            try:
                return int(v), name
            except ValueError:
                raise ConfigError(name, f"not an integer: {v!r}") from None
    return None, ""


def role_of(spare: bool, spares: int, env: Mapping[str, str], node_index: int | None = None,
            nodes_total: int | None = None) -> Role:
    """The role of this agent (see the module doc); ConfigError when `spares` is given and
    the node's place in the allocation cannot be known or leaves no active node."""
    if spares < 0:
        raise ConfigError("spares", f"must be 0 or more, got {spares}")
    if spare:
        return Role(True, node_index, nodes_total, "--spare")
    if not spares:
        return Role(False, node_index, nodes_total)
    index, where = (node_index, "--node-index") if node_index is not None \
        else _int(env, "SLURM_NODEID", "JOB_COMPLETION_INDEX")
    total, twhere = (nodes_total, "--nodes-total") if nodes_total is not None \
        else _int(env, settings.NODES_TOTAL.name, "SLURM_STEP_NUM_NODES", "SLURM_JOB_NUM_NODES",
                  "SLURM_NNODES")
    if index is None or total is None:
        raise ConfigError("spares", "--spares needs this node's place in the allocation: "
                          "--node-index and --nodes-total, or Slurm's SLURM_NODEID and "
                          "SLURM_STEP_NUM_NODES, or a Kubernetes Indexed Job's "
                          "JOB_COMPLETION_INDEX with --nodes-total")
    if not 0 <= index < total:
        raise ConfigError("node_index", f"{where}={index} is outside 0..{total - 1} "
                                        f"({twhere}={total})")
    if spares >= total:
        raise ConfigError("spares", f"{spares} spare(s) of {total} node(s) leave no active node")
    active = total - spares
    return Role(index >= active, index, total,
                f"node {index} of {total} ({where}, {twhere}); nodes 0..{active - 1} active")


def check_spare(cfg: Any, run_source: str) -> None:
    """A spare must follow the job's decisions (a swap is one) and share the run's id (its
    notes are refused by a run it cannot name: a made-up id joins no run)."""
    if not cfg.follow_decisions:
        raise ConfigError("spare", "a spare follows the job's decisions to be swapped in: "
                                   "drop --no-follow-decisions")
    if run_source in ("generated", ""):
        raise ConfigError("spare", "a spare needs the run's shared id to register with it: "
                                   "run it under Slurm or Kubernetes, give torchrun "
                                   "--rdzv-id, or pass the same --run-id to every agent")


# ---- the rendezvous endpoint ----------------------------------------------------------------

def rendezvous_endpoint(cmd: Sequence[str], env: Mapping[str, str]) -> str | None:
    """`host[:port]` where a torchrun launch meets, as faultwatch.launch reads the line:
    `--rdzv-endpoint` (or PET_RDZV_ENDPOINT), else the master address; None for
    `--standalone` (torchrun meets on localhost:0 then) or a launch without torchrun."""
    from faultwatch.launch import parse

    t = parse(cmd, env).torchrun
    if t is None or t.standalone:
        return None
    return t.rdzv_endpoint or t.master_addr


def endpoint_host(endpoint: str) -> str:
    """The host of `host[:port]`, `[v6]:port` or a bare IPv6 address, lowercased."""
    host = endpoint.rsplit(":", 1)[0] if endpoint.count(":") == 1 or endpoint.startswith("[") \
        else endpoint
    return host.strip("[]").lower()


def hosts_rendezvous(endpoint: str | None, names: Sequence[str], ours: Sequence[str],
                     theirs: Sequence[str]) -> bool | None:
    """Whether this machine is `endpoint`'s host, as torchrun decides which process serves
    the c10d store (torch/distributed/elastic/rendezvous/utils.py _matches_machine_hostname):
    the host is one of this machine's `names` (its hostname, canonical names) or addresses
    (`ours`), or one of the host's resolved addresses (`theirs`) is ours. None when unknown:
    no endpoint, or a loopback one (every node of a one-machine job matches it; the first
    torchrun to bind the port serves the store)."""
    if not endpoint:
        return None
    host = endpoint_host(endpoint)
    if host in ("localhost", "localhost.localdomain", "ip6-localhost"):
        return None
    try:
        ip = ipaddress.ip_address(host)
    except ValueError:
        ip = None
    if ip is not None and ip.is_loopback:
        return None
    mine = {n.lower() for n in (*names, *ours) if n}
    return host in mine or any(a.lower() in mine for a in theirs)
