"""The run identity: sources in order, scheduler identity, labels, bad values."""

from __future__ import annotations

import pytest

from faultwatch.agents.config import AgentConfig
from faultwatch.agents.identity import rdzv_id_of, resolve_identity
from faultwatch.errors import ConfigError

SLURM = {"SLURM_JOB_ID": "901", "SLURMD_NODENAME": "gpu7", "SLURM_JOB_NAME": "llama"}
ARRAY = {**SLURM, "SLURM_ARRAY_JOB_ID": "900", "SLURM_ARRAY_TASK_ID": "3"}
K8S = {"FAULTWATCH_K8S_NAMESPACE": "ml", "FAULTWATCH_K8S_POD": "train-0",
       "FAULTWATCH_K8S_NODE": "node-a", "FAULTWATCH_K8S_UID": "5f1c-uid"}
TORCH = ("torchrun", "--nnodes", "2", "--rdzv-id", "rz-42", "train.py")


def ident(flag: str | None = None, labels: tuple[str, ...] = (), env: dict[str, str] | None = None,
          cmd: tuple[str, ...] = ()) -> tuple[str, str, dict[str, object]]:
    i = resolve_identity(flag, labels, env or {}, cmd, lambda: "abc")
    return i.run_id, i.run_source, i.scheduler


def test_sources_in_order() -> None:
    everything = {**ARRAY, **K8S, "TORCHELASTIC_RUN_ID": "te", "FAULTWATCH_RUN_ID": "env-flag"}
    assert ident("cli", env=everything, cmd=TORCH)[:2] == ("cli", "flag")
    assert ident(None, env=everything, cmd=TORCH)[:2] == ("env-flag", "flag")
    del everything["FAULTWATCH_RUN_ID"]
    assert ident(None, env=everything, cmd=TORCH)[:2] == ("900_3", "slurm")  # array task
    assert ident(None, env=SLURM, cmd=TORCH)[:2] == ("901", "slurm")
    assert ident(None, env={**K8S, "TORCHELASTIC_RUN_ID": "te"}, cmd=TORCH)[:2] == (
        "rz-42", "torchrun")
    assert ident(None, env={**K8S, "TORCHELASTIC_RUN_ID": "te"})[:2] == ("te", "torchrun")
    assert ident(None, env=K8S)[:2] == ("5f1c-uid", "kubernetes")
    assert ident(None, env={})[:2] == ("g-abc", "generated")


def test_torchrun_default_rdzv_id_none_is_not_an_identity() -> None:
    assert ident(cmd=("torchrun", "--rdzv_id=none", "t.py"))[:2] == ("g-abc", "generated")
    assert ident(env={"TORCHELASTIC_RUN_ID": "none"})[1] == "generated"
    assert rdzv_id_of(("torchrun", "--rdzv_id=x1", "t.py")) == "x1"
    assert rdzv_id_of(("torchrun", "--rdzv-id", "x2")) == "x2"
    assert rdzv_id_of(("torchrun", "--rdzv-id")) is None


def test_scheduler_identity_and_labels() -> None:
    assert ident(env=ARRAY)[2] == {"kind": "slurm", "job_id": "901", "array_job_id": "900",
                                   "array_task_id": "3", "node": "gpu7", "job_name": "llama"}
    assert ident(env=K8S)[2] == {"kind": "kubernetes", "namespace": "ml", "pod": "train-0",
                                 "node": "node-a", "uid": "5f1c-uid"}
    assert ident(labels=("team=ml", "prio=")) == (
        "g-abc", "generated", {"labels": {"team": "ml", "prio": ""}})
    assert ident(env={})[2] == {}


@pytest.mark.parametrize("flag,labels,env", [
    ("a\nb", (), {}), ("x" * 257, (), {}), (None, ("novalue",), {}), (None, ("=v",), {}),
    (None, (), {"SLURM_JOB_ID": "1\r2"}),
])
def test_bad_values_are_config_errors(flag: str | None, labels: tuple[str, ...],
                                      env: dict[str, str]) -> None:
    with pytest.raises(ConfigError):
        ident(flag, labels, env)


def test_config_resolves_once_and_keeps_it() -> None:
    cfg = AgentConfig.from_env_defaults(env={**SLURM, "FAULTWATCH_BOOTSTRAP": "k:1"}, job="j",
                                        node="n", cmd=("python", "t.py"), labels=("a=b",))
    assert (cfg.run_id, cfg.run_source) == ("901", "slurm")
    assert cfg.scheduler["labels"] == {"a": "b"}
    gen = AgentConfig.from_env_defaults(env={"FAULTWATCH_BOOTSTRAP": "k:1"}, job="j",
                                        node="n", cmd=("a",))
    assert gen.run_source == "generated" and gen.run_id.startswith("g-")
    direct = AgentConfig(bootstrap="k:1", job="j", node="n", cmd=("a",), spool_dir="/s")
    assert direct.run_id.startswith("g-") and direct.run_source == "generated"
