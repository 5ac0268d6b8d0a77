"""What a training launch says about itself, for the run identity: torchrun's options (its
command line, else the `PET_<OPTION>` environment torchrun itself reads), whether the launch
spans several nodes, and the run id every node of it derives without a flag.

Every node of one torchrun job meets at the same rendezvous: `--rdzv-endpoint` (c10d, etcd),
else the static master `--master-addr:--master-port` (or `MASTER_ADDR:MASTER_PORT`, which
Kubeflow's PyTorchJob and torchrun itself set for the ranks). Two live jobs cannot share one
endpoint (torchrun's own run id defaults to `none`, so the endpoint is what tells them
apart), so `rdzv-<hash of job name and endpoint>` is the same on every node of a launch and
differs between concurrent launches. A later launch at the same endpoint derives the same
id: the job stage starts it afresh once the earlier run is over (core/runs.py), and an agent
refuses decisions older than its own start (agents/decisions.py).

A loopback or port-0 endpoint (`--standalone`, `localhost:0`) names no shared place: no id is
derived from it. A launch that spans nodes and derives nothing is warned about
(`run_id_not_shared`): its agents' generated ids differ, so give `--run-id`.
"""

from __future__ import annotations

import hashlib
import ipaddress
import os
import shlex
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

TORCHRUN_MODULES = ("torch.distributed.run", "torch.distributed.launch")
# torchrun options that take no value (everything else starting with -- takes one)
_NO_VALUE = {"standalone", "no-python", "no_python", "module", "m", "run-path", "run_path"}
_SHELLS = ("sh", "bash", "dash", "zsh")
PREFIX = "rdzv-"


@dataclass(frozen=True)
class Launch:
    """What the wrapped command (and its environment) tells about the launch."""

    torchrun: bool = False
    rdzv_id: str | None = None  # --rdzv-id as given (torchrun's default `none` included)
    endpoint: str | None = None  # host:port every node meets at, if the launch names one
    nnodes: str | None = None  # torchrun's --nnodes as given: N or MIN:MAX


def _torchrun_args(cmd: Sequence[str]) -> list[str] | None:
    """torchrun's own arguments (before the training script) in `cmd`, or None when `cmd`
    runs no torchrun (a `sh -c '...'` wrapper is looked into)."""
    if len(cmd) >= 3 and os.path.basename(cmd[0]) in _SHELLS and cmd[1] == "-c":
        try:
            return _torchrun_args(shlex.split(cmd[2]))
        except ValueError:
            return None
    for i, arg in enumerate(cmd):
        base = os.path.basename(arg)
        if base == "torchrun" or base.startswith("torchrun"):
            return _options(cmd[i + 1:])
        if arg == "-m" and i + 1 < len(cmd) and cmd[i + 1] in TORCHRUN_MODULES:
            return _options(cmd[i + 2:])
        if base in ("exec", "env", "srun", "nohup", "time") or "=" in arg \
                or base.startswith("python"):
            continue
        if not arg.startswith("-"):
            return None  # another program: its arguments are not torchrun's
    return None


def _options(args: Sequence[str]) -> list[str]:
    """The arguments up to the training script (the first positional)."""
    out: list[str] = []
    i = 0
    while i < len(args):
        arg = args[i]
        if not arg.startswith("-"):
            break
        out.append(arg)
        name = arg.lstrip("-")
        if "=" not in arg and name not in _NO_VALUE and i + 1 < len(args):
            out.append(args[i + 1])
            i += 1
        i += 1
    return out


def _option(args: Sequence[str], name: str) -> str | None:
    """The value of torchrun option `name` (`-`/`_` spellings, `=` or a space)."""
    spellings = {f"--{name}", f"--{name.replace('-', '_')}"}
    for i, arg in enumerate(args):
        flag, sep, value = arg.partition("=")
        if flag in spellings:
            if sep:
                return value
            if i + 1 < len(args):
                return args[i + 1]
    return None


def launch_of(cmd: Sequence[str], env: Mapping[str, str]) -> Launch:
    """The launch's identity-relevant options: torchrun's flags first, then the `PET_*`
    variables torchrun reads for the flags not given, then MASTER_ADDR/MASTER_PORT."""
    args = _torchrun_args(cmd)
    torchrun = args is not None
    args = args or []

    def opt(name: str) -> str | None:
        value = _option(args, name) if torchrun else None
        if value is None:
            value = env.get("PET_" + name.upper().replace("-", "_"))
        value = (value or "").strip()
        return value or None

    endpoint = opt("rdzv-endpoint")
    if endpoint is None:
        addr = opt("master-addr") or (env.get("MASTER_ADDR") or "").strip()
        port = opt("master-port") or (env.get("MASTER_PORT") or "").strip()
        endpoint = f"{addr}:{port}" if addr and port else None
    return Launch(torchrun=torchrun, rdzv_id=opt("rdzv-id"), endpoint=endpoint,
                  nnodes=opt("nnodes"))


def max_nodes(nnodes: str | None) -> int | None:
    """The largest node count of `--nnodes` (N or MIN:MAX), None when not a number."""
    if not nnodes:
        return None
    try:
        return int(nnodes.rsplit(":", 1)[-1])
    except ValueError:
        return None


def spans_nodes(launch: Launch, nnodes: int | None, env: Mapping[str, str]) -> bool:
    """The launch runs on more than one node: torchrun's --nnodes, the agent's --nnodes, or
    a world larger than this node's ranks (rank mode's WORLD_SIZE / LOCAL_WORLD_SIZE)."""
    if (max_nodes(launch.nnodes) or 0) > 1 or (nnodes or 0) > 1:
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
        if ipaddress.ip_address(host).is_loopback or ipaddress.ip_address(host).is_unspecified:
            return None
    except ValueError:
        pass
    return f"{host}:{int(port)}"


def derived_run_id(job: str, launch: Launch) -> str | None:
    """`rdzv-<16 hex>` of the job name and the launch's shared endpoint, or None."""
    endpoint = shared_endpoint(launch.endpoint)
    if endpoint is None:
        return None
    digest = hashlib.sha256(f"{job}\x1f{endpoint}".encode()).hexdigest()[:16]
    return PREFIX + digest
