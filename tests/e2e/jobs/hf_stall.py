"""A tiny Hugging Face Trainer job run as users run it: no faultwatch code, default tqdm bar.

GPT-2 built from a config, random tokens, DDP over gloo under torchrun.
- FW_STALL_AT=N: rank FW_RANK stops for good after step N (the others wait in the next
  collective); 0: never.
- FW_SAVE_AT=N: the checkpoint at step N is written through a crawling file (torch.save),
  FW_SAVE_S seconds of silence; 0: no checkpoint.
Marks (`<event> <rank> <unix time>` lines) go to the file $FW_MARKS, never to the output.
"""

import os
import sys
import time

import torch
from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainerCallback, TrainingArguments

STALL_AT = int(os.environ.get("FW_STALL_AT", "25"))
SAVE_AT = int(os.environ.get("FW_SAVE_AT", "0"))
STUCK_RANK = int(os.environ.get("FW_RANK", "1"))
SAVE_S = float(os.environ.get("FW_SAVE_S", "60"))
RANK = int(os.environ.get("RANK", "0"))


class Tokens(torch.utils.data.Dataset):
    def __len__(self) -> int:
        return 4096

    def __getitem__(self, i: int) -> dict:
        ids = torch.randint(0, 64, (16,), generator=torch.Generator().manual_seed(i))
        return {"input_ids": ids, "labels": ids.clone()}


def mark(event: str) -> None:
    if os.environ.get("FW_MARKS"):
        with open(os.environ["FW_MARKS"], "a") as f:
            f.write(f"{event} {RANK} {time.time()}\n")


class Stall(TrainerCallback):
    def on_step_end(self, args, state, control, **kwargs):  # noqa: ANN001, ANN003, ANN201
        if RANK == STUCK_RANK and state.global_step == STALL_AT:
            mark("stall")
            time.sleep(3600)  # the culprit: never reaches the next collective


_until: list[float] = []  # when the slow checkpoint (every file of it) is written


class _SlowFile:
    """A file on crawling shared storage: the first write of each file waits until the
    checkpoint's FW_SAVE_S have passed (inside torch.save, as a slow filesystem would)."""

    def __init__(self, f):  # noqa: ANN001
        self.f, self.waited = f, False

    def write(self, b):  # noqa: ANN001, ANN201
        if not self.waited:
            self.waited = True
            time.sleep(max(0.0, _until[0] - time.monotonic()))
        return self.f.write(b)

    def __getattr__(self, name):  # noqa: ANN001, ANN201
        return getattr(self.f, name)


_save = torch.save


def slow_save(obj, f, *a, **kw):  # noqa: ANN001, ANN002, ANN003, ANN201
    if isinstance(f, str | os.PathLike):
        if not _until:
            _until.append(time.monotonic() + SAVE_S)
        mark("save")
        with open(f, "wb") as fh:
            out = _save(obj, _SlowFile(fh), *a, **kw)
        mark("saved")
        return out
    return _save(obj, f, *a, **kw)


if SAVE_AT:
    torch.save = slow_save

model = GPT2LMHeadModel(GPT2Config(vocab_size=64, n_positions=16, n_embd=16, n_layer=1,
                                   n_head=2, bos_token_id=0, eos_token_id=0))
args = TrainingArguments(output_dir=sys.argv[1], per_device_train_batch_size=8,
                         max_steps=int(os.environ.get("STEPS", "60")), logging_steps=5,
                         save_strategy="steps" if SAVE_AT else "no",
                         save_steps=SAVE_AT or 1, report_to=[], use_cpu=True, disable_tqdm=False,
                         ddp_backend="gloo", dataloader_num_workers=0)
Trainer(model=model, args=args, train_dataset=Tokens(), callbacks=[Stall()]).train()
print("trained", flush=True)
