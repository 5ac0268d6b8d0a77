"""A plain DDP job (gloo, CPU) whose rank FW_RANK stops before step FW_STALL_AT's backward:
the other ranks block inside backward, in DDP's gradient all-reduce (the reducer's hook),
with no torch.distributed Python frame on their stacks.
Marks (`<event> <rank> <unix time>` lines) go to the file $FW_MARKS.
"""

import os
import time

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

STALL_AT = int(os.environ.get("FW_STALL_AT", "10"))
STUCK_RANK = int(os.environ.get("FW_RANK", "1"))

dist.init_process_group("gloo")
rank = dist.get_rank()
model = DDP(torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 1)))
opt = torch.optim.SGD(model.parameters(), lr=0.01)


def mark(event: str) -> None:
    if os.environ.get("FW_MARKS"):
        with open(os.environ["FW_MARKS"], "a") as f:
            f.write(f"{event} {rank} {time.time()}\n")


for step in range(1, 1000):
    loss = model(torch.randn(16, 32)).pow(2).mean()
    if step == STALL_AT:
        mark("stall")
        if rank == STUCK_RANK:
            time.sleep(3600)  # the culprit: never joins this step's gradient all-reduce
    opt.zero_grad()
    loss.backward()
    opt.step()
    if step % 5 == 0:
        print(f"step {step} loss {loss.item():.4f}", flush=True)
    time.sleep(0.1)
