"""A Hugging Face Trainer job (GPT-2 built from a config, random tokens, no downloads) with
faultwatch's callback, writing its own true timeline like goodput_ddp.py (same truth.jsonl
events, GP_* variables): its steps, saves and evaluations as the Trainer's hooks see them.

    GP_PLAN   the fault of each attempt: none | crash@N (rank 1 raises a retryable error
              before step N); the Trainer resumes from its last checkpoint
    GP_STEPS  max_steps; GP_CKPTS the save interval is its first value; GP_EVALS likewise
"""

import json
import os
import time

import torch
from transformers import (
    GPT2Config,
    GPT2LMHeadModel,
    Trainer,
    TrainerCallback,
    TrainingArguments,
)
from transformers.trainer_utils import get_last_checkpoint

from faultwatch.integrations.huggingface import FaultwatchCallback

DIR = os.environ["GP_DIR"]
ATTEMPT = int(os.environ.get("FAULTWATCH_ATTEMPT", "0"))
RANK = int(os.environ.get("RANK", "0"))
STEP_S = float(os.environ.get("GP_STEP_S", "0.2"))
TRUTH = open(os.path.join(DIR, "truth.jsonl"), "a")  # noqa: SIM115


def started_at(pid: int) -> float:
    """A process's start time (Unix seconds), from /proc: its start in clock ticks since boot,
    against the uptime now (to 10 ms; /proc/stat's btime is whole seconds)."""
    now = time.time()
    with open(f"/proc/{pid}/stat") as f:
        ticks = int(f.read().rsplit(")", 1)[1].split()[19])
    with open("/proc/uptime") as f:
        up = float(f.read().split()[0])
    return now - (up - ticks / os.sysconf("SC_CLK_TCK"))


def mark(ev: str, **kw: object) -> None:
    kw.setdefault("ts", time.time())
    TRUTH.write(json.dumps({"ev": ev, "attempt": ATTEMPT, "rank": RANK, **kw}) + "\n")
    TRUTH.flush()


class Tokens(torch.utils.data.Dataset):
    def __len__(self) -> int:
        return 4096

    def __getitem__(self, i: int) -> dict:
        ids = torch.randint(0, 64, (16,), generator=torch.Generator().manual_seed(i))
        return {"input_ids": ids, "labels": ids.clone()}


class Truth(TrainerCallback):
    """The job's own clock at the Trainer's hooks (rank 0), and the injected fault."""

    def __init__(self) -> None:
        plan = os.environ.get("GP_PLAN", "none").split(",")
        fault, _, at = (plan[ATTEMPT] if ATTEMPT < len(plan) else "none").partition("@")
        self.crash_at = int(at) if fault == "crash" else -1

    def on_step_begin(self, args, state, control, **kw):  # noqa: ANN001, ANN201
        if RANK == 1 and state.global_step + 1 == self.crash_at:
            mark("crash", step=state.global_step + 1)
            raise ConnectionError(f"[Errno 104] Connection reset by peer while fetching "
                                  f"shard {state.global_step + 1}")
        time.sleep(STEP_S)

    def on_step_end(self, args, state, control, **kw):  # noqa: ANN001, ANN201
        if RANK != 0:
            return
        mark("step", step=state.global_step)
        if control.should_evaluate:
            mark("eval_start", step=state.global_step)
        elif control.should_save:
            mark("ckpt_start", step=state.global_step)

    def on_evaluate(self, args, state, control, **kw):  # noqa: ANN001, ANN201
        if RANK == 0:
            mark("eval_end", step=state.global_step)
            if control.should_save:
                mark("ckpt_start", step=state.global_step)

    def on_save(self, args, state, control, **kw):  # noqa: ANN001, ANN201
        if RANK == 0:
            mark("ckpt_end", step=state.global_step)


def main() -> None:
    mark("launch", ts=started_at(os.getppid()), torchrun_pid=os.getppid())
    out = os.path.join(DIR, "out")
    every = int(os.environ.get("GP_CKPTS", "10").split(",")[0])
    model = GPT2LMHeadModel(GPT2Config(vocab_size=64, n_positions=16, n_embd=16, n_layer=1,
                                       n_head=2, bos_token_id=0, eos_token_id=0))
    args = TrainingArguments(output_dir=out, per_device_train_batch_size=4,
                             max_steps=int(os.environ.get("GP_STEPS", "24")),
                             save_steps=every, eval_strategy="steps",
                             eval_steps=int(os.environ.get("GP_EVALS", "16").split(",")[0]),
                             logging_steps=4, report_to=[], use_cpu=True, ddp_backend="gloo",
                             dataloader_num_workers=0, disable_tqdm=False)
    trainer = Trainer(model=model, args=args, train_dataset=Tokens(),
                      eval_dataset=torch.utils.data.Subset(Tokens(), range(32)),
                      callbacks=[FaultwatchCallback(), Truth()])
    last = get_last_checkpoint(out) if os.path.isdir(out) else None
    trainer.train(resume_from_checkpoint=last)
    mark("end")
    TRUTH.close()
    os._exit(0)  # no interpreter teardown: seconds of silence on a loaded machine


if __name__ == "__main__":
    main()
