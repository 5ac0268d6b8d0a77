"""What a training launch says about its run identity: its rendezvous id, the endpoint every
node of it meets at, whether it spans several nodes, and the run id every node of it derives
without a flag. The command line is read by faultwatch/launch (torchrun's options, the `PET_*`
environment torchrun itself reads, wrappers such as `sh -c` and `srun`).

Every node of one torchrun job meets at the same rendezvous: `--rdzv-endpoint` (c10d, etcd),
else the static master `--master-addr:--master-port`, else (a plain `python train.py` under
torchrun's ranks or Kubeflow's PyTorchJob) `MASTER_ADDR:MASTER_PORT`. Two live jobs cannot
share one endpoint (torchrun's own run id defaults to `none`, so the endpoint is what tells
them apart), so `rdzv-<hash of job name and endpoint>` is the same on every node of a launch
and differs between concurrent launches. A later launch at the same endpoint derives the same
id: the job stage starts it afresh once the earlier run is over (core/runs.py), and an agent
refuses decisions older than its own start (agents/decisions.py).

A loopback or port-0 endpoint (`--standalone`, torchrun's default master 127.0.0.1) names no
shared place: no id is derived from it. A launch that spans nodes and derives nothing is
warned about (`run_id_not_shared`): its agents' generated ids differ, so give `--run-id`.
"""

from __future__ import annotations

import hashlib
import ipaddress
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from faultwatch.launch import parse

PREFIX = "rdzv-"
TORCHRUN_DEFAULT_RDZV_ID = "none"  # torchrun's default --rdzv-id: not an identity


@dataclass(frozen=True)
class Identity:
    """What the launch tells about the run's identity."""

    rdzv_id: str | None = None  # --rdzv-id (or PET_RDZV_ID), not torchrun's default
    endpoint: str | None = None  # host:port every node meets at, if the launch names one
    nnodes: int | None = None  # the most nodes torchrun's --nnodes allows


def launch_of(cmd: Sequence[str], env: Mapping[str, str]) -> Identity:
    """The launch's identity: torchrun's options (flags, else PET_*), else the
    MASTER_ADDR/MASTER_PORT a plain training script reads."""
    tr = parse(cmd, env, training=False).torchrun if cmd else None
    if tr is None:
        addr, port = (env.get("MASTER_ADDR") or "").strip(), (env.get("MASTER_PORT") or "").strip()
        return Identity(endpoint=f"{addr}:{port}" if addr and port else None)
    rid = (tr.rdzv_id or "").strip()
    endpoint = None if tr.standalone else (tr.rdzv_endpoint or "").strip() or None
    if endpoint is None and not tr.standalone and tr.master_addr and tr.master_port:
        endpoint = f"{tr.master_addr}:{tr.master_port}"
    return Identity(rdzv_id=rid if rid and rid != TORCHRUN_DEFAULT_RDZV_ID else None,
                    endpoint=endpoint, nnodes=tr.nnodes_max)


def spans_nodes(launch: Identity, nnodes: int | None, env: Mapping[str, str]) -> bool:
    """The launch runs on more than one node: torchrun's --nnodes, the agent's --nnodes, or
    a world larger than this node's ranks (rank mode's WORLD_SIZE / LOCAL_WORLD_SIZE)."""
    if (launch.nnodes or 0) > 1 or (nnodes or 0) > 1:
        return True
    try:
        world, local = int(env.get("WORLD_SIZE", "")), int(env.get("LOCAL_WORLD_SIZE", ""))
    except ValueError:
        return False
    return world > local > 0


def shared_endpoint(endpoint: str | None) -> str | None:
    """`endpoint` when it names a place other nodes can reach: a host and a port other than
    0, the host not a loopback name or address."""
    if not endpoint:
        return None
    host, sep, port = endpoint.strip().rpartition(":")
    if not sep or not host or not port.isdigit() or int(port) == 0:
        return None  # no port: the backend's default differs between launch styles
    host = host.strip("[]").lower()
    if host in ("localhost", "localhost.localdomain", "ip6-localhost"):
        return None
    try:
        ip = ipaddress.ip_address(host)
        if ip.is_loopback or ip.is_unspecified:
            return None
    except ValueError:
        pass
    return f"{host}:{int(port)}"


def derived_run_id(job: str, launch: Identity) -> str | None:
    """`rdzv-<16 hex>` of the job name and the launch's shared endpoint, or None."""
    endpoint = shared_endpoint(launch.endpoint)
    if endpoint is None:
        return None
    return PREFIX + hashlib.sha256(f"{job}\x1f{endpoint}".encode()).hexdigest()[:16]
