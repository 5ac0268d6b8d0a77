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

import http.client
import os
import subprocess
import sys
import threading
import time

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

PLAYS = os.environ.get("FW_SCENARIO", "stuck_before_collective").split(",")
FIRST_AT = int(os.environ.get("FW_AT", "50"))
GAP = int(os.environ.get("FW_GAP", "25"))
AT = {FIRST_AT + i * GAP: name for i, name in enumerate(PLAYS)}  # step -> scenario
SILENCE_S = float(os.environ.get("FW_SILENCE_S", "20"))
STEPS = max(AT) + 15
BATCH = 8
SLOW_BATCH = next((s for s, name in AT.items() if name in ("slow_data", "stuck_worker")), -1)

dist.init_process_group("gloo")
rank = dist.get_rank()


def mark(event: str, scenario: str) -> None:
    if os.environ.get("FW_MARKS"):
        with open(os.environ["FW_MARKS"], "a") as f:
            f.write(f"{event}:{scenario} {rank} {time.time()}\n")


def burn(seconds: float) -> None:
    """CPU work with no output (an evaluation, a compiler, a decoder)."""
    end, x = time.monotonic() + seconds, torch.randn(64, 64)
    while time.monotonic() < end:
        x = torch.tanh(x @ x.T / 64)


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


SLOW_STORE = """
import socket, sys, time
s = socket.socket(); s.bind(("127.0.0.1", 0)); s.listen(1)
print(s.getsockname()[1], flush=True)
c, _ = s.accept()
end, size, n = time.monotonic() + float(sys.argv[1]), int(sys.argv[2]), 0
while n < size:
    got = c.recv(4096 if time.monotonic() < end else 1 << 20)  # slow, then done
    if not got:
        break
    n += len(got)
    if time.monotonic() < end:
        time.sleep(0.05)
c.sendall(b"HTTP/1.1 200 OK\\r\\nContent-Length: 0\\r\\n\\r\\n")
"""
UPLOAD_BYTES = 32 << 20  # the checkpoint, padded to outlast the socket buffers


def upload() -> None:
    """PUT the checkpoint bytes to the slow store through http.client (as SDKs do)."""
    store = subprocess.Popen([sys.executable, "-c", SLOW_STORE, str(SILENCE_S),
                              str(UPLOAD_BYTES)], stdout=subprocess.PIPE, text=True)
    assert store.stdout is not None
    port = int(store.stdout.readline())
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=SILENCE_S + 60)
    conn.request("PUT", "/bucket/ckpt.pt", body=bytes(UPLOAD_BYTES))
    conn.getresponse().read()
    store.wait(30)


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
