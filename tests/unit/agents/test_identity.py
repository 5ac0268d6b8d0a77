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


# ---- issue 36 item 2: every node of one launch derives the same run id --------------------

C10D = ("torchrun", "--nnodes=2", "--nproc-per-node=8", "--rdzv-backend=c10d",
        "--rdzv-endpoint=gpu-master:29400", "train.py", "--lr", "1e-4")


def test_two_nodes_of_one_rendezvous_launch_derive_the_same_id_without_flags() -> None:
    """The headline example of docs/agent.md: no --run-id, no --rdzv-id. Before: each agent
    generated its own id (g-<uuid>) and the job stage saw two runs."""
    a = resolve_identity(None, (), {}, C10D, lambda: "node-a", job="llm")
    b = resolve_identity(None, (), {}, C10D, lambda: "node-b", job="llm")
    assert a.run_source == b.run_source == "rendezvous"
    assert a.run_id == b.run_id and a.run_id.startswith("rdzv-")
    # another job name or another endpoint: another run
    assert resolve_identity(None, (), {}, C10D, lambda: "x", job="other").run_id != a.run_id
    moved = tuple(x.replace("gpu-master", "gpu-other") for x in C10D)
    assert resolve_identity(None, (), {}, moved, lambda: "x", job="llm").run_id != a.run_id


def test_the_launch_is_read_from_every_place_torchrun_reads_it() -> None:
    def rid(cmd: tuple[str, ...], env: dict[str, str]) -> tuple[str, str]:
        i = resolve_identity(None, (), env, cmd, lambda: "abc", job="j")
        return i.run_id, i.run_source

    want = rid(("torchrun", "--rdzv_endpoint", "h:1", "t.py"), {})
    assert want[1] == "rendezvous"
    # PET_* (Kubeflow's PyTorchJob sets them), python -m, sh -c, MASTER_ADDR/PORT
    assert rid(("torchrun", "t.py"), {"PET_RDZV_ENDPOINT": "h:1"}) == want
    assert rid(("python3", "-m", "torch.distributed.run", "--rdzv-endpoint=h:1", "t.py"),
               {}) == want
    assert rid(("bash", "-c", "exec torchrun --rdzv-endpoint h:1 t.py"), {}) == want
    static = rid(("torchrun", "--master-addr=h", "--master-port=1", "t.py"), {})
    assert static == want == rid(("python", "t.py"), {"MASTER_ADDR": "h", "MASTER_PORT": "1"})
    # an id given anywhere torchrun reads one wins (PET_RDZV_ID: torchrun's env spelling)
    assert rid(("torchrun", "t.py"), {"PET_RDZV_ID": "job-9", "PET_RDZV_ENDPOINT": "h:1"}) \
        == ("job-9", "torchrun")
    # the training script's own arguments are not torchrun's
    assert rid(("torchrun", "--standalone", "t.py", "--rdzv-endpoint=h:1"), {})[1] == \
        "generated"


def test_no_id_is_derived_from_a_place_other_nodes_cannot_reach() -> None:
    for endpoint in ("localhost:29400", "127.0.0.1:29400", "[::1]:29400", "h:0", "h", ""):
        i = resolve_identity(None, (), {}, ("torchrun", f"--rdzv-endpoint={endpoint}", "t.py"),
                             lambda: "abc", job="j")
        assert i.run_source == "generated", endpoint


def test_a_multi_node_launch_with_a_generated_id_is_warned_about() -> None:
    """`run_id_not_shared` (a warning on the agent's stderr) when the launch spans nodes
    and no shared id could be found; none for a single node or a shared id."""
    from faultwatch.agents.rendezvous import launch_of, spans_nodes

    def spans(cmd: tuple[str, ...], env: dict[str, str], nnodes: int | None = None) -> bool:
        return spans_nodes(launch_of(cmd, env), nnodes, env)

    assert spans(("torchrun", "--nnodes=2", "--rdzv-endpoint=localhost:0", "t.py"), {})
    assert spans(("torchrun", "--nnodes", "1:4", "t.py"), {})
    assert spans(("python", "t.py"), {"WORLD_SIZE": "16", "LOCAL_WORLD_SIZE": "8"})
    assert spans(("python", "t.py"), {}, nnodes=2)
    assert not spans(("torchrun", "--standalone", "--nproc-per-node=8", "t.py"), {})
    assert not spans(("python", "t.py"), {"WORLD_SIZE": "8", "LOCAL_WORLD_SIZE": "8"})
