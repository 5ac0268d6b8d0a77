"""A Hugging Face Trainer job (transformers, torchrun, 2 ranks, gloo, CPU) for the hang
evaluation matrix's `trainer` framework (tests/support/hang_matrix.py): GPT-2 built from a
config (nothing downloaded), random tokens, the default tqdm bar and loss dicts, no faultwatch
code. The Trainer's own loop runs; the scenarios FW_SCENARIO names (comma-separated, FW_GAP
steps apart from step FW_AT) are played from a TrainerCallback and the datasets:

- save: at the step's end the callback asks the Trainer to save (`control.should_save`); the
  checkpoint's torch.save writes go through a crawling file for FW_SILENCE_S.
- upload: the callback asks for a save, and in `on_save` rank 0 uploads the checkpoint by HTTP
  PUT to an object store that reads slowly (a local server process); rank 1 goes on to its
  next step and waits in DDP's all-reduce.
- eval: the callback asks the Trainer to evaluate (`control.should_evaluate`); the model's
  forward in eval mode is heavy (FW_SILENCE_S of CPU over one batch per rank; no bar shows
  before the first batch is done).
- compile: a compile-like CPU burn in the callback, longer on rank 0.
- slow_data: the training set's loader worker takes FW_SILENCE_S to decode one batch.
- stuck_before_collective: rank 1 stops for good in `on_step_end` (rank 0 waits in the next
  step's collectives); the culprit is rank 1.
Marks (`<event>:<scenario> <rank> <unix time>`) go to $FW_MARKS, never to the output.
"""

import os
import sys
import time

import torch
from matrix_kit import RANK, SILENCE_S, burn, mark, schedule, upload
from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainerCallback, TrainingArguments

AT = schedule("", 30, 12)  # step -> scenario
STEPS = (max(AT) if AT else 30) + 12
BATCH = 8
STEP_S = 0.2  # each step takes at least this (a real step does work)
SLOW_STEP = next((s for s, name in AT.items() if name == "slow_data"), -1)


class Tokens(torch.utils.data.Dataset):
    """Random token sequences; in `slow_data` the loader worker's item that starts the batch
    of step SLOW_STEP takes FW_SILENCE_S (the worker counts the items it made)."""

    def __init__(self, n: int) -> None:
        self.n, self.made = n, 0

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> dict:
        self.made += 1
        if SLOW_STEP > 0 and self.made == BATCH * (SLOW_STEP - 1) + 1:
            mark("silence", "slow_data")
            burn(SILENCE_S)  # decoding a huge sample: the worker works
        ids = torch.randint(0, 64, (16,), generator=torch.Generator().manual_seed(i))
        return {"input_ids": ids, "labels": ids.clone()}


class HeavyEval(GPT2LMHeadModel):
    """Evaluation is heavy: the forward pass in eval mode computes for FW_SILENCE_S."""

    def forward(self, input_ids=None, labels=None, **kw):  # noqa: ANN001, ANN003, ANN201
        if not self.training:
            burn(SILENCE_S)
        return super().forward(input_ids=input_ids, labels=labels, **kw)


_slow_until: list[float] = []  # set while the `save` scenario's checkpoint is written
_save = torch.save


class _SlowFile:
    """A file on crawling storage: the first write waits until the save's time is up."""

    def __init__(self, f) -> None:  # noqa: ANN001
        self.f, self.waited = f, False

    def write(self, b):  # noqa: ANN001, ANN201
        if not self.waited and _slow_until:
            self.waited = True
            time.sleep(max(0.0, _slow_until[0] - time.monotonic()))
        return self.f.write(b)

    def __getattr__(self, name):  # noqa: ANN001, ANN201
        return getattr(self.f, name)


def slow_save(obj, f, *a, **kw):  # noqa: ANN001, ANN002, ANN003, ANN201
    """torch.save to crawling storage while the `save` scenario's checkpoint is written."""
    if _slow_until and isinstance(f, str | os.PathLike):
        with open(f, "wb") as fh:
            return _save(obj, _SlowFile(fh), *a, **kw)
    return _save(obj, f, *a, **kw)


torch.save = slow_save

class Scenarios(TrainerCallback):
    """Plays each scenario at its step's end, through the Trainer's own controls."""

    def __init__(self) -> None:
        self.playing: str | None = None

    def on_step_end(self, args, state, control, **kwargs):  # noqa: ANN001, ANN003, ANN201
        time.sleep(STEP_S)
        step = state.global_step
        if step == SLOW_STEP + 1:
            mark("resumed", "slow_data")  # the slow batch was trained on
        name = AT.get(step)
        if name is None or name == "slow_data":
            return
        self.playing = name
        if name == "stuck_before_collective":
            if RANK == 1:
                mark("stall", name)
                time.sleep(3600)  # the culprit: never reaches the next collective
            return
        if name == "save":
            mark("silence", name)
            _slow_until.append(time.monotonic() + SILENCE_S)
            control.should_save = True
        elif name == "upload":
            control.should_save = True
        elif name == "eval":
            mark("silence", name)
            control.should_evaluate = True
        elif name == "compile":
            mark("silence", name)
            burn(SILENCE_S if RANK == 0 else SILENCE_S / 3)
            mark("resumed", name)

    def on_save(self, args, state, control, **kwargs):  # noqa: ANN001, ANN003, ANN201
        if self.playing == "save":
            _slow_until.clear()
            mark("resumed", "save")
        elif self.playing == "upload" and RANK == 0:
            mark("silence", "upload")
            upload()
            mark("resumed", "upload")
        self.playing = None

    def on_evaluate(self, args, state, control, **kwargs):  # noqa: ANN001, ANN003, ANN201
        if self.playing == "eval":
            mark("resumed", "eval")
        self.playing = None


torch.manual_seed(0)
model = HeavyEval(GPT2Config(vocab_size=64, n_positions=16, n_embd=16, n_layer=1, n_head=2,
                             bos_token_id=0, eos_token_id=0))
args = TrainingArguments(output_dir=sys.argv[1], per_device_train_batch_size=BATCH,
                         per_device_eval_batch_size=BATCH, max_steps=STEPS, logging_steps=5,
                         save_strategy="steps", save_steps=10**6, eval_strategy="no",
                         report_to=[], use_cpu=True, disable_tqdm=False, ddp_backend="gloo",
                         dataloader_num_workers=1 if SLOW_STEP > 0 else 0)
Trainer(model=model, args=args, train_dataset=Tokens(BATCH * 2 * (STEPS + 8)),
        eval_dataset=Tokens(2 * BATCH), callbacks=[Scenarios()]).train()
print("trained", flush=True)
