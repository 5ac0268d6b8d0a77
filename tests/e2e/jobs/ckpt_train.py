"""A gloo training loop that checkpoints every step and resumes from its last checkpoint.

In attempt 0 the node named by FW_XID_NODE prints an NVIDIA Xid 79 line at step FW_XID_STEP
and hangs (the GPU fell off the bus: the other ranks wait in their all-reduce). Every step
appends a line to FW_TIMELINE (JSON: wall time, step, attempt, node, rank, the step it
resumed from), the truth the hot-spare test and bench measure against; so do the worker's
start and the end of its process group's rendezvous (`event`: start, init).
"""

import time

T0 = time.time()  # the worker's start (torch is not imported yet)

import datetime  # noqa: E402
import json  # noqa: E402
import os  # noqa: E402
import sys  # noqa: E402

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

CKPT = os.environ["FW_CKPT"]
TIMELINE = os.environ.get("FW_TIMELINE", "")
STEPS = int(os.environ.get("FW_STEPS", "12"))
STEP_S = float(os.environ.get("FW_STEP_S", "0.3"))
XID_NODE = os.environ.get("FW_XID_NODE", "")
XID_STEP = int(os.environ.get("FW_XID_STEP", "4"))
NODE = os.environ.get("FAULTWATCH_NODE", os.environ.get("SLURMD_NODENAME", "?"))
ATTEMPT = int(os.environ.get("FAULTWATCH_ATTEMPT", os.environ.get("SLURM_RESTART_COUNT", "0")))
XID = "NVRM: Xid (PCI:0000:3b:00): 79, pid={pid}, GPU has fallen off the bus."


def record(**kw: object) -> None:
    if TIMELINE:
        with open(TIMELINE, "a") as f:  # one short O_APPEND write per line
            f.write(json.dumps(kw) + "\n")


def main() -> None:
    record(event="start", t=T0, attempt=ATTEMPT, node=NODE)
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=120))
    rank = dist.get_rank()
    record(event="init", t=time.time(), attempt=ATTEMPT, node=NODE, rank=rank)
    start = 0
    if rank == 0 and os.path.exists(CKPT):
        with open(CKPT) as f:
            start = int(json.load(f)["step"]) + 1
    t = torch.tensor([start])
    dist.broadcast(t, 0)  # every rank resumes where rank 0's checkpoint says
    start = int(t.item())
    x = torch.ones(4)
    for step in range(start, STEPS):
        if NODE == XID_NODE and ATTEMPT == 0 and step == XID_STEP:
            print(XID.format(pid=os.getpid()), file=sys.stderr, flush=True)
            time.sleep(3600)
        dist.all_reduce(x)
        print(f"step {step} loss {1.0 / (step + 1):.4f} rank {rank}", flush=True)
        record(t=time.time(), step=step, attempt=ATTEMPT, node=NODE, rank=rank,
               resumed_from=start)
        if rank == 0:
            tmp = f"{CKPT}.tmp"
            with open(tmp, "w") as f:
                json.dump({"step": step}, f)
            os.replace(tmp, CKPT)
        time.sleep(STEP_S)
    dist.barrier()
    dist.destroy_process_group()
    print(f"rank {rank} done", flush=True)


if __name__ == "__main__":
    main()
