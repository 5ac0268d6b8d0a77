"""One rank per node of a 2-node gloo launch: meet, all-reduce a few steps, print each, then
(FW_THEN="silent") stay silent without exiting, or exit 0."""

import os
import time

import torch
import torch.distributed as dist

dist.init_process_group("gloo")
rank = dist.get_rank()
x = torch.ones(4)
for step in range(3):
    dist.all_reduce(x)
    print(f"step {step} rank {rank} loss {x[0].item():.1f}", flush=True)
if os.environ.get("FW_THEN") == "silent":
    time.sleep(600)  # silent, alive: a hang once the ranks have printed
dist.destroy_process_group()
