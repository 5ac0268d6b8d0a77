"""Training-SDK example: stages with their own hang windows, progress, NaN check (torchrun).

    faultwatch agent --job demo --follow-decisions -- \
        torchrun --standalone --nproc-per-node=2 examples/sdk_train.py

Without an agent (plain `torchrun ... examples/sdk_train.py`) every sdk call is a no-op.
"""

import os
import time

import torch
import torch.distributed as dist

from faultwatch import sdk

STEPS = int(os.environ.get("STEPS", "20"))

# Failures whose logs contain these are retryable for this job (restart, not fail).
sdk.set_retryable_errors(["shard server unavailable", r"Connection reset by peer"])


@sdk.stage("eval", hang_window_s=None)  # evaluation may be silent for long: no hang alarm
def evaluate(model: torch.nn.Module) -> float:
    with torch.no_grad():
        return float(model(torch.ones(1, 8)).sum())


def main() -> None:
    with sdk.stage("init", hang_window_s=1800):  # first rendezvous and data loading are slow
        dist.init_process_group("gloo")
        model = torch.nn.Linear(8, 1)
        opt = torch.optim.SGD(model.parameters(), lr=0.01)
    mon = sdk.StepMonitor(check_every=1)  # step time per rank + NaN/Inf loss -> notify
    with sdk.stage("train", hang_window_s=120):
        for step in range(STEPS):
            loss = model(torch.randn(4, 8)).pow(2).mean()
            opt.zero_grad()
            loss.backward()
            for p in model.parameters():
                dist.all_reduce(p.grad)
            opt.step()
            mon.step(step, loss=loss, lr=opt.param_groups[0]["lr"])
            time.sleep(0.05)
            if step % 10 == 9:
                evaluate(model)
    if dist.get_rank() == 0:
        sdk.notify(f"training finished after {STEPS} steps", level="info")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
