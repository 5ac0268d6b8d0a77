"""The typed launch description: each value with where it came from (flag, env, default, ...)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

# Where a value came from: a flag, the environment, a rule file's policy, the scheduler's
# own configuration, what the processor learned from earlier runs, a documented default;
# `unknown`: nothing readable says (a launcher we do not know, a value we could not parse,
# a setting made in code); `derived`: computed from other values (`where` says how).
FLAG, ENV, RULES, SCHEDULER, LEARNED, DEFAULT, DERIVED, UNKNOWN = (
    "flag", "env", "rules", "scheduler", "learned", "default", "derived", "unknown")
ORIGINS = (FLAG, ENV, RULES, SCHEDULER, LEARNED, DEFAULT, DERIVED, UNKNOWN)

Value = float | int | str | bool | None


@dataclass(frozen=True)
class Setting:
    """One value of the launch: `value` None when unknown; `origin` one of ORIGINS; `where`
    says exactly where (`--rdzv-conf join_timeout`, `PET_RDZV_CONF`, `torch 2.15.0
    torch/distributed/launcher/api.py`, or why it is unknown)."""

    key: str
    value: Value
    origin: str
    where: str

    @property
    def known(self) -> bool:
        return self.value is not None and self.origin != UNKNOWN

    @property
    def seconds(self) -> float | None:
        """The value as seconds when it is a known number, else None."""
        if not self.known or isinstance(self.value, bool | str):
            return None
        return float(self.value)  # type: ignore[arg-type]

    def source(self) -> str:
        """`flag --x`, `env X`, `default of torch 2.15.0 (file)`, `unknown: why`."""
        if self.origin == DEFAULT:
            return f"default of {self.where}"
        if self.origin == DERIVED:
            return self.where
        if self.origin == UNKNOWN:
            return f"unknown: {self.where}"
        return f"{self.origin} {self.where}"

    def to_dict(self) -> dict[str, Any]:
        return {"key": self.key, "value": self.value, "origin": self.origin,
                "source": self.source()}


def unknown(key: str, why: str) -> Setting:
    return Setting(key, None, UNKNOWN, why)


@dataclass(frozen=True)
class Torchrun:
    """torchrun's own options as torch/distributed/run.py reads them (flag, then PET_<NAME>
    in the environment, then the default); `origin` maps each field to its Setting.

    The rendezvous: `rdzv_backend` static (torchrun's default: a TCPStore on the master,
    `timeout`), c10d / etcd-v2 (the dynamic rendezvous, `join_timeout`), etcd (the legacy
    one, `timeout`); `--standalone` is c10d on a local free port."""

    nnodes_min: int | None = None
    nnodes_max: int | None = None
    nproc_per_node: str | None = None
    rdzv_backend: str | None = None
    rdzv_endpoint: str | None = None
    rdzv_id: str | None = None
    rdzv_conf: Mapping[str, str] = field(default_factory=lambda: MappingProxyType({}))
    standalone: bool = False
    max_restarts: int | None = None
    monitor_interval_s: float | None = None
    shutdown_timeout_s: float | None = None
    node_rank: int | None = None
    master_addr: str | None = None
    master_port: int | None = None
    origin: Mapping[str, Setting] = field(default_factory=lambda: MappingProxyType({}))

    def to_dict(self) -> dict[str, Any]:
        return {"nnodes": [self.nnodes_min, self.nnodes_max],
                "nproc_per_node": self.nproc_per_node, "rdzv_backend": self.rdzv_backend,
                "rdzv_endpoint": self.rdzv_endpoint, "rdzv_id": self.rdzv_id,
                "rdzv_conf": dict(self.rdzv_conf), "standalone": self.standalone,
                "max_restarts": self.max_restarts,
                "monitor_interval_s": self.monitor_interval_s,
                "shutdown_timeout_s": self.shutdown_timeout_s, "node_rank": self.node_rank,
                "master_addr": self.master_addr, "master_port": self.master_port}


@dataclass(frozen=True)
class Launch:
    """What a command line and its environment say about the job's launch.

    `launcher`: torchrun (also `python -m torch.distributed.run` and accelerate's and
    the legacy `torch.distributed.launch`), deepspeed, python (a plain script), or
    unknown; `wrappers`: what ran it (`srun`, `env`, `bash -c`); `script`: the training
    program and its arguments; `settings`: every timeout-related value, by key (see
    launch/defaults.py for the keys); `problems`: what could not be read, in words."""

    argv: tuple[str, ...]
    launcher: str = UNKNOWN
    wrappers: tuple[str, ...] = ()
    torchrun: Torchrun | None = None
    script: tuple[str, ...] = ()
    settings: Mapping[str, Setting] = field(default_factory=lambda: MappingProxyType({}))
    problems: tuple[str, ...] = ()

    def get(self, key: str) -> Setting:
        """The setting `key`, or an unknown one when the launch says nothing of it."""
        s = self.settings.get(key)
        return s if s is not None else unknown(key, f"the {self.launcher} launch does not "
                                                    "say")

    def to_dict(self) -> dict[str, Any]:
        return {"argv": list(self.argv), "launcher": self.launcher,
                "wrappers": list(self.wrappers),
                "torchrun": self.torchrun.to_dict() if self.torchrun else None,
                "script": list(self.script[:1]),
                "settings": {k: s.to_dict() for k, s in sorted(self.settings.items())},
                "problems": list(self.problems)}
