"""A 2-rank gloo job that hangs in a chosen way (FW_SCENARIO), for hang diagnosis tests.

- sleep:    rank 1 stops before the 6th all_reduce; rank 0 waits in it.
- extra:    rank 0 issues one all_reduce more than rank 1, which then computes (sleeps).
- mismatch: at the 6th collective rank 0 calls all_reduce, rank 1 broadcast.
Each rank prints `ready <rank>` right before it blocks.
"""

import os
import time

import torch
import torch.distributed as dist

from faultwatch import sdk  # noqa: F401 - arms the rank's dump watcher when the agent asks

dist.init_process_group("gloo")
rank = dist.get_rank()
scenario = os.environ.get("FW_SCENARIO", "sleep")
x = torch.ones(3, 4)
for _ in range(5):
    dist.all_reduce(x)
print(f"ready {rank}", flush=True)
if scenario == "sleep":
    if rank == 1:
        time.sleep(600)  # the culprit: never reaches the next collective
    dist.all_reduce(x)
elif scenario == "extra":
    if rank == 0:
        dist.all_reduce(x)  # one more than rank 1
        dist.all_reduce(x)
    else:
        dist.all_reduce(x)
        time.sleep(600)
elif scenario == "mismatch":
    if rank == 0:
        dist.all_reduce(x)
    else:
        dist.broadcast(x, src=0)
    time.sleep(600)
