"""A command line and its environment as a typed launch description (pure): torchrun read as
torch's own argparse reads it, the wrappers, the frameworks' flags, unknowns never guessed."""

from __future__ import annotations

import pytest

from faultwatch.launch import parse, start_deadline_s
from faultwatch.launch.model import DEFAULT, ENV, FLAG, UNKNOWN

SEED = ("torchrun --nproc_per_node 8 --nnodes 8 --node_rank 2 --master_addr m0 --master_port "
        "23456 pretrain.py --tensor-model-parallel-size 2 --distributed-timeout-minutes 60 "
        "--save-interval 500 --exit-signal-handler").split()


def test_the_seed_launch_static_rendezvous_and_megatron_timeout() -> None:
    la = parse(SEED, {})
    assert la.launcher == "torchrun" and la.problems == ()
    tr = la.torchrun
    assert tr is not None
    assert (tr.nnodes_min, tr.nnodes_max, tr.nproc_per_node) == (8, 8, "8")
    assert (tr.rdzv_backend, tr.node_rank, tr.master_addr, tr.master_port) == \
        ("static", 2, "m0", 23456)
    dl = la.get("rdzv.deadline_s")  # the store's timeout torchrun passes: LaunchConfig's 900
    assert (dl.value, dl.origin) == (900, DEFAULT) and "launcher/api.py" in dl.where
    assert start_deadline_s(la) == 900
    assert la.get("pg.timeout_s.nccl").value == 3600.0
    assert la.get("pg.timeout_s.nccl").source() == "flag --distributed-timeout-minutes " \
                                                   "(Megatron-LM)"
    assert la.get("checkpoint.interval_steps").value == 500
    assert la.get("framework.save_on_sigterm").value is True
    assert la.script[0] == "pretrain.py"


@pytest.mark.parametrize("argv", [
    ["torchrun", "--rdzv-backend=c10d", "--rdzv-conf=join_timeout=1800", "t.py"],
    ["torchrun", "--rdzv_backend", "c10d", "--rdzv_conf", "join_timeout=1800", "t.py"],
    ["torchrun", "--rdzv-b", "c10d", "--rdzv-co", "join_timeout=1800", "t.py"],  # abbrev.
    ["python3", "-u", "-m", "torch.distributed.run", "--rdzv-backend", "c10d",
     "--rdzv-conf", "join_timeout=1800", "t.py"],
    ["python", "-m", "torch.distributed.launch", "--use-env", "--rdzv-backend", "c10d",
     "--rdzv-conf", "join_timeout=1800", "t.py"],
])
def test_every_spelling_of_a_torchrun_option(argv: list[str]) -> None:
    la = parse(argv, {})
    assert la.launcher == "torchrun", la.problems
    s = la.get("rdzv.join_timeout_s")
    assert (s.value, s.origin) == (1800, FLAG)
    assert la.get("rdzv.deadline_s").value == 1800 and la.script == ("t.py",)


def test_the_scripts_own_arguments_are_not_torchruns() -> None:
    la = parse(["torchrun", "--nnodes", "2", "t.py", "--max-restarts", "9", "--nnodes", "5"],
               {})
    assert la.get("torchrun.max_restarts").value == 0  # torchrun's default, not the script's
    assert la.torchrun is not None and la.torchrun.nnodes_max == 2
    assert la.script == ("t.py", "--max-restarts", "9", "--nnodes", "5")


def test_pet_variables_stand_in_for_flags_and_a_flag_wins() -> None:
    env = {"PET_RDZV_BACKEND": "c10d", "PET_RDZV_CONF": "join_timeout=60,last_call_timeout=5",
           "PET_MAX_RESTARTS": "3", "PET_NNODES": "2:4"}
    la = parse(["torchrun", "--max-restarts", "1", "t.py"], env)
    assert la.get("rdzv.join_timeout_s").source() == "env PET_RDZV_CONF join_timeout"
    assert la.get("torchrun.max_restarts").value == 1
    assert la.get("torchrun.max_restarts").origin == FLAG
    # an elastic range waits the last call beyond the join timeout
    assert start_deadline_s(la) == 65


def test_defaults_by_backend() -> None:
    static = parse(["torchrun", "--nnodes", "2", "t.py"], {})
    assert static.get("rdzv.timeout_s").value == 900
    c10d = parse(["torchrun", "--nnodes", "2", "--rdzv-backend", "c10d", "t.py"], {})
    assert (c10d.get("rdzv.join_timeout_s").value, c10d.get("rdzv.read_timeout_s").value,
            c10d.get("rdzv.last_call_timeout_s").value) == (600, 60, 30)
    assert start_deadline_s(c10d) == 600
    alone = parse(["torchrun", "--standalone", "--nproc-per-node", "2", "t.py"], {})
    assert alone.torchrun is not None
    assert (alone.torchrun.rdzv_backend, alone.torchrun.nnodes_max) == ("c10d", 1)
    other = parse(["torchrun", "--rdzv-backend", "my-backend", "t.py"], {})
    assert other.get("rdzv.deadline_s").origin == UNKNOWN
    assert start_deadline_s(other) is None
    assert static.get("torchrun.shutdown_timeout_s").value == 30
    env = parse(["torchrun", "t.py"], {"TORCH_ELASTIC_SHUTDOWN_TIMEOUT": "5"})
    assert env.get("torchrun.shutdown_timeout_s").source() == \
        "env TORCH_ELASTIC_SHUTDOWN_TIMEOUT"


@pytest.mark.parametrize(("argv", "env", "problem"), [
    (["torchrun", "--nnodes=$SLURM_NNODES", "t.py"], {}, "'$SLURM_NNODES' is not a number"),
    (["torchrun", "--rdzv-backend", "c10d", "--rdzv-conf", "join_timeout=ten", "t.py"], {},
     "'ten' is not a number"),
    (["torchrun", "--rdzv-conf", "join_timeout", "t.py"], {}, "not <key>=<value>"),
    (["torchrun", "--frobnicate", "t.py"], {}, "unknown torchrun option --frobnicate"),
    (["torchrun", "--nnodes"], {}, "has no value"),
    (["torchrun", "t.py"], {"TORCH_NCCL_HEARTBEAT_TIMEOUT_SEC": "soon"}, "not an integer"),
])
def test_what_cannot_be_read_is_unknown_and_said(argv: list[str], env: dict[str, str],
                                                  problem: str) -> None:
    la = parse(argv, env)
    assert any(problem in p for p in la.problems), la.problems


def test_unparseable_values_are_unknown_never_a_default() -> None:
    la = parse(["torchrun", "--rdzv-backend", "c10d", "--rdzv-conf", "join_timeout=$T",
                "--nnodes=$N", "t.py"], {"TORCH_NCCL_HEARTBEAT_TIMEOUT_SEC": "x"})
    for key in ("rdzv.join_timeout_s", "rdzv.deadline_s", "torchrun.nnodes_max",
                "nccl.heartbeat_timeout_s"):
        s = la.get(key)
        assert (s.value, s.origin) == (None, UNKNOWN), key
    assert start_deadline_s(la) is None


def test_wrappers_env_srun_and_a_simple_shell_command() -> None:
    la = parse(["srun", "-N", "2", "--ntasks-per-node=1", "--signal=USR1@60", "--label",
                "env", "PET_RDZV_CONF=join_timeout=77", "bash", "-c",
                "exec torchrun --nnodes=2 --rdzv-backend=c10d --rdzv-endpoint=h:29400 t.py"],
               {})
    assert la.launcher == "torchrun" and la.wrappers == ("srun", "env", "bash -c")
    assert la.get("rdzv.join_timeout_s").value == 77  # env's assignment reached torchrun
    assert la.get("slurm.step_signal").value == "USR1@60"


def test_a_shell_script_is_not_read() -> None:
    la = parse(["bash", "-c", "cd /x && torchrun --nnodes 2 t.py"], {})
    assert la.launcher == "unknown"
    assert any("shell script" in p for p in la.problems)


@pytest.mark.parametrize("argv", [["mpirun", "-np", "8", "python", "t.py"], ["./run.sh"],
                                  []])
def test_unknown_launchers_are_unknown(argv: list[str]) -> None:
    la = parse(argv, {})
    assert la.launcher == "unknown" and la.torchrun is None
    assert la.get("rdzv.deadline_s").origin == UNKNOWN and la.problems


def test_accelerate_reads_only_what_its_command_line_says() -> None:
    la = parse(["accelerate", "launch", "--multi_gpu", "--num_machines", "2",
                "--max_restarts", "2", "t.py", "--ddp_timeout", "7200"], {})
    assert la.launcher == "accelerate"
    assert la.get("torchrun.max_restarts").value == 2
    assert la.get("pg.timeout_s.nccl").value == 7200.0  # transformers' --ddp_timeout
    # its config file (not read) may set the rendezvous: unknown, not torch's default
    assert la.get("rdzv.deadline_s").origin == UNKNOWN
    assert "config file" in la.get("rdzv.deadline_s").where


def test_deepspeed_timeout_from_its_variable() -> None:
    la = parse(["deepspeed", "--num_nodes", "2", "--no_ssh_check", "t.py"],
               {"DEEPSPEED_TIMEOUT": "45"})
    assert la.launcher == "deepspeed" and la.script == ("t.py",)
    assert (la.get("pg.timeout_s.nccl").value, la.get("pg.timeout_s.nccl").origin) == \
        (2700.0, ENV)
    plain = parse(["deepspeed", "t.py"], {})
    assert plain.get("pg.timeout_s.nccl").value == 1800.0  # deepspeed/constants.py: 30 min


def test_nccl_variables() -> None:
    la = parse(["torchrun", "t.py"], {"TORCH_NCCL_HEARTBEAT_TIMEOUT_SEC": "120",
                                      "TORCH_NCCL_ENABLE_MONITORING": "0",
                                      "NCCL_ASYNC_ERROR_HANDLING": "0"})
    assert la.get("nccl.heartbeat_timeout_s").value == 120
    assert la.get("nccl.enable_monitoring").value is False
    assert la.get("nccl.async_error_handling").source() == "env NCCL_ASYNC_ERROR_HANDLING"
    dflt = parse(["torchrun", "t.py"], {})
    # torchrun gives its workers 1 (local_elastic_agent.py), not ProcessGroupNCCL's 3
    assert dflt.get("nccl.async_error_handling").value == 1
    assert parse(["python", "t.py"], {}).get("nccl.async_error_handling").origin == UNKNOWN


def test_the_description_is_json_ready() -> None:
    import json

    d = parse(SEED, {}).to_dict()
    assert json.loads(json.dumps(d))["settings"]["rdzv.deadline_s"]["value"] == 900
