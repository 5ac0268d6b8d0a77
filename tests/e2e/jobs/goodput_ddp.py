"""A DDP training job (gloo, CPU) that writes its own true timeline, for the goodput tests.

Every rank appends JSON lines to $GP_DIR/truth.jsonl: its torchrun's start (the launch, read
from /proc: the job cannot see it otherwise), every step (rank 0, right after its line),
checkpoint and eval starts and ends, and the faults it injects. Only rank 0 prints (as
Megatron and the Trainer do); checkpoints go to $GP_DIR/ckpt.pt and are resumed from.

    GP_PLAN        the fault of each attempt ($FAULTWATCH_ATTEMPT), comma-separated:
                   none | crash@N (rank 1 raises a retryable error at step N) |
                   hang@N (rank 1 stops before step N's all-reduce) |
                   preempt@N (rank 0 sends SIGTERM to its torchrun at step N, as a scheduler)
    GP_STEPS       last step (default 30); GP_STEP_S seconds a step (0.2)
    GP_LAST        the last step of each attempt, comma-separated (default GP_STEPS)
    GP_CKPTS       steps after which a checkpoint is saved ("5,20"); GP_CKPT_S its seconds
    GP_EVALS       steps after which an evaluation runs ("8,16"); GP_EVAL_S its seconds
"""

import json
import os
import signal
import time

import torch
import torch.distributed as dist

DIR = os.environ["GP_DIR"]
STEPS = int(os.environ.get("GP_STEPS", "30"))
STEP_S = float(os.environ.get("GP_STEP_S", "0.2"))
CKPTS = {int(s) for s in os.environ.get("GP_CKPTS", "5,20").split(",") if s}
CKPT_S = float(os.environ.get("GP_CKPT_S", "0.6"))
EVALS = {int(s) for s in os.environ.get("GP_EVALS", "8,16").split(",") if s}
EVAL_S = float(os.environ.get("GP_EVAL_S", "0.8"))
ATTEMPT = int(os.environ.get("FAULTWATCH_ATTEMPT", "0"))
CKPT = os.path.join(DIR, "ckpt.pt")
_LAST = os.environ.get("GP_LAST", "").split(",")
if ATTEMPT < len(_LAST) and _LAST[ATTEMPT]:
    STEPS = int(_LAST[ATTEMPT])


def started_at(pid: int) -> float:
    """A process's start time (Unix seconds), from /proc: its start in clock ticks since boot,
    against the uptime now (to 10 ms; /proc/stat's btime is whole seconds)."""
    now = time.time()
    with open(f"/proc/{pid}/stat") as f:
        ticks = int(f.read().rsplit(")", 1)[1].split()[19])
    with open("/proc/uptime") as f:
        up = float(f.read().split()[0])
    return now - (up - ticks / os.sysconf("SC_CLK_TCK"))


def main() -> None:
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    plan = os.environ.get("GP_PLAN", "none").split(",")
    fault, _, at = (plan[ATTEMPT] if ATTEMPT < len(plan) else "none").partition("@")
    fault_step = int(at) if at else -1
    truth = open(os.path.join(DIR, "truth.jsonl"), "a")  # noqa: SIM115

    def mark(ev: str, **kw: object) -> None:
        kw.setdefault("ts", time.time())
        truth.write(json.dumps({"ev": ev, "attempt": ATTEMPT, "rank": rank, **kw}) + "\n")
        truth.flush()

    mark("launch", ts=started_at(os.getppid()), torchrun_pid=os.getppid(), pid=os.getpid())
    torch.manual_seed(0)
    model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(64, 64))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    start = 1
    if os.path.exists(CKPT):
        state = torch.load(CKPT)
        model.module.load_state_dict(state["model"])
        start = state["step"] + 1
    for step in range(start, STEPS + 1):
        t0 = time.time()
        if step == fault_step and fault == "crash" and rank == 1:
            mark("crash", step=step)
            raise ConnectionError(f"[Errno 104] Connection reset by peer while fetching shard "
                                  f"{step}")
        if step == fault_step and fault == "hang" and rank == 1:
            mark("hang", step=step)
            time.sleep(3600)
        if step == fault_step and fault == "preempt" and rank == 0:
            mark("preempt", step=step)
            os.kill(os.getppid(), signal.SIGTERM)  # what a scheduler's preemption sends
            time.sleep(3600)
        x = torch.randn(16, 64)
        loss = model(x).pow(2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        time.sleep(max(0.0, STEP_S - (time.time() - t0)))
        if rank == 0:
            print(f"step {step}/{STEPS} loss {loss.item():.4f}", flush=True)
            mark("step", step=step)
        if step in CKPTS:
            if rank == 0:
                print(f"saving checkpoint at iteration {step:7d} to {DIR}", flush=True)
                mark("ckpt_start", step=step)
                torch.save({"step": step, "model": model.module.state_dict()}, CKPT + ".tmp")
                os.replace(CKPT + ".tmp", CKPT)
                time.sleep(CKPT_S)
                print(f"  successfully saved checkpoint from iteration {step:7d} to {DIR}",
                      flush=True)
                mark("ckpt_end", step=step)
            dist.barrier()
        if step in EVALS:
            if rank == 0:
                print("***** Running Evaluation *****", flush=True)
                mark("eval_start", step=step)
            time.sleep(EVAL_S)
            dist.barrier()
            if rank == 0:
                print(f"{{'eval_loss': {loss.item():.4f}, 'step': {step}}}", flush=True)
                mark("eval_end", step=step)
    dist.barrier()
    mark("end")
    dist.destroy_process_group()
    # no interpreter teardown (many seconds on a loaded machine: silence a hang window could
    # take for a hang); the truth is written and flushed
    os._exit(0)


if __name__ == "__main__":
    main()
