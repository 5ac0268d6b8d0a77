"""A tiny gloo all-reduce training loop whose faults are chosen by environment variables."""

import os
import sys
import time

import torch
import torch.distributed as dist

FAULT = os.environ.get("FW_FAULT", "none")  # none | retryable | fatal | hang | sigkill
FAULT_RANK = int(os.environ.get("FW_FAULT_RANK", "1"))
FAULT_STEP = int(os.environ.get("FW_FAULT_STEP", "3"))
FAULT_ATTEMPTS = os.environ.get("FW_FAULT_ATTEMPTS", "all")  # "all" or comma list of attempts
STEPS = int(os.environ.get("FW_STEPS", "6"))
STEP_S = float(os.environ.get("FW_STEP_S", "0.2"))


def fault_active() -> bool:
    if FAULT == "none":
        return False
    if FAULT_ATTEMPTS == "all":
        return True
    attempt = os.environ.get("FAULTWATCH_ATTEMPT", "0")
    return attempt in FAULT_ATTEMPTS.split(",")


def main() -> None:
    dist.init_process_group("gloo", timeout=__import__("datetime").timedelta(seconds=60))
    rank = dist.get_rank()
    x = torch.ones(4)
    for step in range(STEPS):
        if rank == FAULT_RANK and step == FAULT_STEP and fault_active():
            if FAULT == "retryable":
                raise ConnectionError(f"[Errno 104] Connection reset while fetching shard {step}")
            if FAULT == "fatal":
                import faultwatch_missing_module  # noqa: F401
            if FAULT == "hang":
                print(f"rank {rank} stuck before all_reduce", flush=True)
                time.sleep(3600)
            if FAULT == "sigkill":
                os.kill(os.getpid(), 9)
        dist.all_reduce(x)
        print(f"step {step} loss {1.0 / (step + 1):.4f} rank {rank}", flush=True)
        time.sleep(STEP_S)
    dist.barrier()
    dist.destroy_process_group()
    print(f"rank {rank} done", flush=True)
    sys.exit(0)


if __name__ == "__main__":
    main()
