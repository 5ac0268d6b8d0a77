"""One DDP job (gloo, CPU, torchrun) for the hang evaluation matrix (tests/e2e/test_hang_matrix.py,
bench/hang_matrix.py): it prints a step line every ~0.2 s, so faultwatch learns a short window,
then from step FW_AT plays the scenarios FW_SCENARIO names (comma-separated, FW_GAP steps
apart: the healthy silences share one job, torch's start-up being the costly part), then
trains 15 steps more and ends. No faultwatch code in the job.

Healthy silences (FW_SILENCE_S seconds without a line, then training resumes and ends):
- save: rank 0 writes a checkpoint (torch.save through a crawling file); rank 1 waits in a barrier.
- upload: rank 0 uploads the checkpoint by HTTP PUT to an object store that reads slowly (a
  local server process); rank 1 waits in a barrier.
- eval: every rank evaluates without logging (CPU-bound forward passes).
- compile: a compile-like CPU burn, longer on rank 0; rank 1 then waits in an all_reduce.
- slow_data: the data loader's worker takes FW_SILENCE_S to decode the next batch on every rank.
Real hangs (faultwatch must decide them and name the culprit):
- stuck_before_collective: rank 1 stops before its next forward; rank 0 waits in DDP's all-reduce.
- deadlock_one: rank 1's main thread and a helper thread deadlock on two locks; rank 0 waits.
- stuck_worker: rank 1's data-loader worker never returns a batch; rank 0 waits in the all-reduce.
- deadlock_all: every rank's main thread deadlocks on its own locks (nobody communicates).
Marks (`<event>:<scenario> <rank> <unix time>`) go to $FW_MARKS: `silence`/`resumed` for
healthy scenarios, `stall` when a hang begins.
"""

import os
import sys
import threading
import time

import torch
import torch.distributed as dist
from matrix_kit import SILENCE_S, burn, mark, schedule, upload
from torch.nn.parallel import DistributedDataParallel as DDP

AT = schedule("stuck_before_collective", 50, 25)  # step -> scenario
STEPS = max(AT) + 15
BATCH = 8
SLOW_BATCH = next((s for s, name in AT.items() if name in ("slow_data", "stuck_worker")), -1)

dist.init_process_group("gloo")
rank = dist.get_rank()


class Samples(torch.utils.data.Dataset):
    """Random samples; in the data scenarios the batch at step FW_AT is slow or never comes."""

    def __len__(self) -> int:
        return BATCH * (STEPS + 4)

    def __getitem__(self, i: int) -> torch.Tensor:
        if i == BATCH * (SLOW_BATCH - 1):
            if AT[SLOW_BATCH] == "slow_data":
                mark("silence", "slow_data")
                burn(SILENCE_S)  # decoding a huge sample: the worker works
            elif rank == 1:
                mark("stall", "stuck_worker")
                time.sleep(3600)  # the worker is stuck: its rank never gets the batch
        return torch.randn(32)


def deadlock() -> None:
    """Two threads take two locks in opposite orders: the main thread blocks for good."""
    a, b = threading.Lock(), threading.Lock()
    a.acquire()

    def other() -> None:
        with b:
            time.sleep(0.2)
            a.acquire()

    threading.Thread(target=other, daemon=True).start()
    time.sleep(0.1)
    b.acquire()  # never returns


class SlowFile:
    """A file on crawling storage: the first write waits until FW_SILENCE_S have passed."""

    def __init__(self, f, until: float):  # noqa: ANN001
        self.f, self.until = f, until

    def write(self, b):  # noqa: ANN001, ANN201
        time.sleep(max(0.0, self.until - time.monotonic()))
        return self.f.write(b)

    def __getattr__(self, name):  # noqa: ANN001, ANN201
        return getattr(self.f, name)


model = DDP(torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 1)))
opt = torch.optim.SGD(model.parameters(), lr=0.01)
workers = 1 if SLOW_BATCH > 0 else 0
loader = iter(torch.utils.data.DataLoader(Samples(), batch_size=BATCH, num_workers=workers))


def play(name: str) -> None:
    """The scenario at this step (the data ones happen inside the loader)."""
    if name in ("stuck_before_collective", "deadlock_one") and rank == 1:
        mark("stall", name)
        if name == "deadlock_one":
            deadlock()
        time.sleep(3600)  # never joins this step's gradient all-reduce
    elif name == "deadlock_all":
        mark("stall", name)
        deadlock()
    elif name == "save":
        if rank == 0:
            mark("silence", name)
            with open(os.path.join(sys.argv[1], "ckpt.pt"), "wb") as f:
                torch.save(model.state_dict(), SlowFile(f, time.monotonic() + SILENCE_S))
        dist.barrier()
    elif name == "upload":
        if rank == 0:
            mark("silence", name)
            upload()
        dist.barrier()
    elif name == "eval":
        mark("silence", name)
        burn(SILENCE_S)
    elif name == "compile":
        mark("silence", name)
        burn(SILENCE_S if rank == 0 else SILENCE_S / 3)
        dist.all_reduce(torch.ones(1))
    if name in ("save", "upload", "eval", "compile"):
        mark("resumed", name)


for step in range(1, STEPS):
    if step in AT:
        play(AT[step])
    x = next(loader)
    if step == SLOW_BATCH and AT[step] == "slow_data":
        mark("resumed", "slow_data")
    loss = model(x).pow(2).mean()
    opt.zero_grad()
    loss.backward()
    opt.step()
    print(f"step {step}/{STEPS - 1} loss {loss.item():.4f}", flush=True)
    time.sleep(0.2)
dist.barrier()
print("trained", flush=True)
