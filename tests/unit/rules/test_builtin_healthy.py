"""The built-in vocabulary on healthy output: lines every healthy job, node and cluster prints
(framework progress and metrics, NCCL/driver info, health checks that passed, schedulers' and
clouds' routine notices) must match no error rule; the same batch with one real failure line
in it matches exactly that line (the positive control)."""

from __future__ import annotations

from faultwatch.core.events import Line
from faultwatch.rules.classify import matcher_for
from tests.support.rules import builtin_ruleset

HEALTHY = [
    # frameworks
    "{'loss': 2.3456, 'grad_norm': 1.25, 'learning_rate': 4.5e-05, 'epoch': 0.12}",
    "{'train_runtime': 12.5, 'train_samples_per_second': 40.1, 'train_loss': 2.1, 'epoch': 1.0}",
    "Epoch 0:  40%|████      | 4/10 [00:01<00:02,  2.90it/s, v_num=0, train_loss=2.310]",
    " iteration      100/  500000 | consumed samples:        12800 | lm loss: 2.345E+00 |"
    " loss scale: 65536.0 | grad norm: 1.2 |",
    "[Rank 0] step=300, skipped=0, lr=[0.0001], mom=[(0.9, 0.95)]",
    # NCCL, driver and GPU tools when all is well
    "gpu-3:1234:1234 [0] NCCL INFO NET/IB : Using [0]mlx5_0:1/IB ; OOB ib0:10.0.0.3<0>",
    "gpu-3:1234:1290 [0] NCCL INFO Channel 00/32 :    0   1   2   3   4   5   6   7",
    "| N/A   34C    P0    61W / 400W |      4MiB / 81920MiB |      0%      Default |",
    "Volatile Uncorr. ECC: 0",
    "    Remapped Rows  Pending : No   Failure : No",
    "NVRM: loading NVIDIA UNIX x86_64 Kernel Module  550.54.15  Tue Mar  5 22:23:56 UTC 2024",
    "nvidia-fabricmanager.service: Started NVIDIA fabric manager service.",
    "fabric state: NVML_GPU_FABRIC_STATE_COMPLETED status: NVML_SUCCESS",
    "Health check passed: GPU 0 NvLink link 7 is up",
    "More than 10 single-bit ECC error(s) detected in GPU 0 Volatile SBEs: 12",
    "NVRM: Xid (PCI:0000:4c:00): 154, GPU recovery action changed from 0x1 (GPU Reset Required)"
    " to 0x0 (None)",
    # schedulers and clouds, routine
    "srun: job 4242 queued and waiting for resources",
    "srun: job 4242 has been allocated resources",
    "   JobState=RUNNING Reason=None Dependency=(null)",
    "4242         train        gpu    research         16  COMPLETED      0:0",
    "  Normal  Scheduled  default-scheduler  Successfully assigned default/trainer-0 to gpu-node-7",
    "  Normal  Started    kubelet            Started container pytorch",
    "maintenance-event: NONE",
    "curl metadata.google.internal/computeMetadata/v1/instance/preempted -> FALSE",
    "Using spot instances to save cost",
    "CUDA available: True, device count: 8",
]

FAILURE = "NVRM: Xid (PCI:0000:3b:00): 79, pid=1234, GPU has fallen off the bus."


def _errors(texts: list[str]) -> list[tuple[str, str]]:
    m = matcher_for(builtin_ruleset())
    lines = [Line("stderr", i, 100.0 + i, t) for i, t in enumerate(texts)]
    batch = m.match_lines(lines)
    return [(x.rule, x.line) for x in batch.matches]


def test_healthy_lines_match_no_error_rule_and_a_failure_in_the_same_batch_does() -> None:
    assert _errors(HEALTHY) == []
    mixed = HEALTHY[:10] + [FAILURE] + HEALTHY[10:]
    assert _errors(mixed) == [("nvidia-xid-reboot-node", FAILURE)]
