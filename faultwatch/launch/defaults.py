"""The defaults of each party of the timeout chain, each read from a primary source.

Every entry names the version it was read from and the file or page that says it. A value
that none of them says is not here: the check reports it as unknown, never a guess.
"""

from __future__ import annotations

from dataclasses import dataclass

from faultwatch.launch.model import DEFAULT, Setting, Value

TORCH = "torch 2.15.0"  # read from the installed package (.venv, .venv-train) and its headers
TORCH_MAIN = "pytorch main (ProcessGroupNCCL.cpp, 2026)"  # C++ defaults not in the headers
MEGATRON = "Megatron-LM megatron/training/arguments.py (main, 000c4ac)"
TRANSFORMERS = "transformers 5.25.0 training_args.py"
DEEPSPEED = "DeepSpeed deepspeed/constants.py (master, e81c70f)"
ACCELERATE = "accelerate 1.16.0"
SLURM = "Slurm 22.05.8 slurm.conf(5)"
KUBERNETES = "Kubernetes v1.37.2 (k8s.io/api core/v1 PodSpec)"


@dataclass(frozen=True)
class Default:
    value: Value
    where: str

    def setting(self, key: str) -> Setting:
        return Setting(key, self.value, DEFAULT, self.where)


D: dict[str, Default] = {
    # torchrun (torch/distributed/run.py, launcher/api.py)
    "torchrun.rdzv_backend": Default("static", f"{TORCH} torch/distributed/run.py"),
    "torchrun.max_restarts": Default(0, f"{TORCH} torch/distributed/run.py"),
    "torchrun.monitor_interval_s": Default(0.1, f"{TORCH} torch/distributed/run.py"),
    "torchrun.shutdown_timeout_s": Default(
        30, f"{TORCH} torch/distributed/launcher/api.py (TORCH_ELASTIC_SHUTDOWN_TIMEOUT)"),
    "torchrun.exit_barrier_timeout_s": Default(
        300, f"{TORCH} torch/distributed/elastic/agent/server/local_elastic_agent.py"),
    # rendezvous: torchrun always passes `timeout` (LaunchConfig.__post_init__: 900)
    "rdzv.timeout_s": Default(900, f"{TORCH} torch/distributed/launcher/api.py"),
    "rdzv.join_timeout_s": Default(
        600, f"{TORCH} torch/distributed/elastic/rendezvous/dynamic_rendezvous.py"),
    "rdzv.last_call_timeout_s": Default(
        30, f"{TORCH} torch/distributed/elastic/rendezvous/dynamic_rendezvous.py"),
    "rdzv.close_timeout_s": Default(
        30, f"{TORCH} torch/distributed/elastic/rendezvous/dynamic_rendezvous.py"),
    "rdzv.read_timeout_s": Default(
        60, f"{TORCH} torch/distributed/elastic/rendezvous/c10d_rendezvous_backend.py"),
    # init_process_group(timeout=None): torch/distributed/constants.py, measured at runtime
    "pg.timeout_s.nccl": Default(600, f"{TORCH} torch.distributed.constants."
                                      "default_pg_nccl_timeout"),
    "pg.timeout_s.gloo": Default(1800, f"{TORCH} torch.distributed.constants."
                                       "default_pg_timeout"),
    # ProcessGroupNCCL (the variables: ProcessGroupNCCL.hpp of torch 2.15.0; values: .cpp)
    "nccl.heartbeat_timeout_s": Default(480, f"{TORCH_MAIN} TORCH_NCCL_HEARTBEAT_TIMEOUT_SEC"),
    "nccl.enable_monitoring": Default(True, f"{TORCH_MAIN} TORCH_NCCL_ENABLE_MONITORING"),
    "nccl.async_error_handling": Default(
        1, f"{TORCH} torch/distributed/elastic/agent/server/local_elastic_agent.py "
           "(torchrun sets 1 for its workers; ProcessGroupNCCL's own default is 3)"),
    "nccl.blocking_wait": Default(False, f"{TORCH_MAIN} TORCH_NCCL_BLOCKING_WAIT"),
    # the schedulers
    "slurm.kill_wait_s": Default(30, f"{SLURM} KillWait"),
    "k8s.termination_grace_s": Default(30, f"{KUBERNETES} terminationGracePeriodSeconds"),
}

# the frameworks' own defaults for init_process_group's timeout, when the script is theirs
# (a command line cannot say whose script it is: these are used only when their flag is set)
MEGATRON_TIMEOUT_MIN = Default(10, f"{MEGATRON} --distributed-timeout-minutes")
HF_DDP_TIMEOUT_S = Default(1800, f"{TRANSFORMERS} --ddp_timeout")
DEEPSPEED_TIMEOUT_MIN = Default(30, f"{DEEPSPEED} DEEPSPEED_TIMEOUT")


def default(key: str) -> Setting:
    """The default setting of `key` (KeyError when no primary source says one)."""
    return D[key].setting(key)
