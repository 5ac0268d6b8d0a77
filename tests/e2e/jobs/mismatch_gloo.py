"""Mismatched collectives on gloo: rank 0 all_reduce, rank 1 broadcast (a classic hang)."""

import datetime
import os
import time

import torch
import torch.distributed as dist

dist.init_process_group("gloo", timeout=datetime.timedelta(
    seconds=float(os.environ.get("FW_PG_TIMEOUT_S", "8"))))
rank = dist.get_rank()
x = torch.ones(1024)
for step in range(int(os.environ.get("FW_STEPS", "20"))):
    dist.all_reduce(x)
    print(f"step {step} rank {rank}", flush=True)
    time.sleep(0.1)
print(f"rank {rank} entering mismatched collective", flush=True)
if rank == 0:
    dist.all_reduce(x)
else:
    dist.broadcast(x, src=0)
dist.barrier()
print(f"rank {rank} done", flush=True)
