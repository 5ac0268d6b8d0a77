"""A plain-Python training stand-in (no torch: it starts in a tenth of a second) writing the
same true timeline as goodput_ddp.py: steps, Megatron-style checkpoint lines, a retryable
crash, a resume from the checkpoint. GP_DIR, GP_PLAN (crash@N or none per attempt),
GP_STEPS, GP_STEP_S, GP_CKPTS as there."""

import json
import os
import sys
import time

DIR = os.environ["GP_DIR"]
ATTEMPT = int(os.environ.get("FAULTWATCH_ATTEMPT", "0"))
STEPS = int(os.environ.get("GP_STEPS", "20"))
STEP_S = float(os.environ.get("GP_STEP_S", "0.2"))
CKPTS = {int(s) for s in os.environ.get("GP_CKPTS", "10").split(",") if s}
STATE = os.path.join(DIR, "ckpt.json")


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
    truth = open(os.path.join(DIR, "truth.jsonl"), "a")  # noqa: SIM115

    def mark(ev: str, **kw: object) -> None:
        kw.setdefault("ts", time.time())
        truth.write(json.dumps({"ev": ev, "attempt": ATTEMPT, "rank": 0, **kw}) + "\n")
        truth.flush()

    mark("launch", ts=started_at(os.getpid()), torchrun_pid=os.getpid())
    plan = os.environ.get("GP_PLAN", "none").split(",")
    fault, _, at = (plan[ATTEMPT] if ATTEMPT < len(plan) else "none").partition("@")
    start = 1
    if os.path.exists(STATE):
        with open(STATE) as f:
            start = json.load(f)["step"] + 1
    time.sleep(0.5)  # start-up
    for step in range(start, STEPS + 1):
        if fault == "crash" and step == int(at):
            mark("crash", step=step)
            print(f"ConnectionError: [Errno 104] Connection reset by peer while fetching shard "
                  f"{step}", file=sys.stderr, flush=True)
            sys.exit(1)
        time.sleep(STEP_S)
        print(f"step {step}/{STEPS} loss {1.0 / step:.4f}", flush=True)
        mark("step", step=step)
        if step in CKPTS:
            print(f"saving checkpoint at iteration {step:7d} to {DIR}", flush=True)
            mark("ckpt_start", step=step)
            time.sleep(0.5)
            with open(STATE + ".tmp", "w") as f:
                json.dump({"step": step}, f)
            os.replace(STATE + ".tmp", STATE)
            print(f"  successfully saved checkpoint from iteration {step:7d} to {DIR}",
                  flush=True)
            mark("ckpt_end", step=step)
    mark("end")


if __name__ == "__main__":
    main()
