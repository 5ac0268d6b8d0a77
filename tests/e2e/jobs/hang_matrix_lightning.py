"""A Lightning job (lightning.pytorch Trainer, strategy ddp, torchrun, 2 ranks, gloo, CPU) for
the hang evaluation matrix's `lightning` framework (tests/support/hang_matrix.py): a linear
module on random data, Lightning's default progress bar (rich, installed in the training
image: it draws nothing while the output is no terminal, so the job is silent from its model
summary to its end and no window is ever learned), no faultwatch code. Lightning's own loop
runs; the scenarios FW_SCENARIO names (comma-separated, FW_GAP steps apart from step FW_AT)
are played from a Callback, the module's validation step and the dataset:

- save: the callback calls `trainer.save_checkpoint` on every rank; the user's CheckpointIO
  writes with torch.save through a crawling file for FW_SILENCE_S (rank 0; rank 1 waits in
  Lightning's barrier).
- upload: a quick checkpoint, then rank 0 uploads it by HTTP PUT to an object store that
  reads slowly (a local server process); rank 1 goes on and waits in the next collective.
- eval: Lightning runs validation at that step (`val_check_interval`); the validation step
  computes for FW_SILENCE_S on every rank.
- compile: a compile-like CPU burn in the callback, longer on rank 0.
- slow_data: the training loader's worker takes FW_SILENCE_S to decode one batch.
- stuck_before_collective: rank 1 stops for good in `on_train_batch_end` (rank 0 waits in the
  next step's collectives); the culprit is rank 1.
Marks (`<event>:<scenario> <rank> <unix time>`) go to $FW_MARKS, never to the output.
"""

import os
import sys
import time

import lightning as L
import torch
from lightning.pytorch.plugins.io import TorchCheckpointIO
from matrix_kit import RANK, SILENCE_S, burn, mark, schedule, upload

AT = schedule("", 30, 12)  # step -> scenario
STEPS = (max(AT) if AT else 30) + 12
BATCH = 8
STEP_S = 0.05  # each step takes at least this (a real step does work)
SLOW_STEP = next((s for s, name in AT.items() if name == "slow_data"), -1)
EVAL_STEP = next((s for s, name in AT.items() if name == "eval"), -1)


class Samples(torch.utils.data.Dataset):
    """Random (x, y) pairs; in `slow_data` the loader worker's item that starts the batch of
    step SLOW_STEP takes FW_SILENCE_S (the worker counts the items it made)."""

    def __init__(self, n: int) -> None:
        self.n, self.made = n, 0

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        self.made += 1
        if SLOW_STEP > 0 and self.made == BATCH * (SLOW_STEP - 1) + 1:
            mark("silence", "slow_data")
            burn(SILENCE_S)  # decoding a huge sample: the worker works
        g = torch.Generator().manual_seed(i)
        return torch.randn(8, generator=g), torch.randn(1, generator=g)


class Tiny(L.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.layer = torch.nn.Linear(8, 1)

    def training_step(self, batch, i):  # type: ignore[no-untyped-def]
        x, y = batch
        time.sleep(STEP_S)
        return torch.nn.functional.mse_loss(self.layer(x), y)

    def validation_step(self, batch, i):  # type: ignore[no-untyped-def]
        if self.trainer.global_step == EVAL_STEP:
            burn(SILENCE_S)  # a heavy evaluation that prints nothing
        x, y = batch
        return torch.nn.functional.mse_loss(self.layer(x), y)

    def configure_optimizers(self):  # type: ignore[no-untyped-def]
        return torch.optim.SGD(self.parameters(), lr=0.01)


class _SlowFile:
    """A file on crawling storage: its first write waits until FW_SILENCE_S have passed."""

    def __init__(self, f, until: float):  # type: ignore[no-untyped-def]
        self.f, self.until, self.waited = f, until, False

    def write(self, b):  # type: ignore[no-untyped-def]
        if not self.waited:
            self.waited = True
            time.sleep(max(0.0, self.until - time.monotonic()))
        return self.f.write(b)

    def __getattr__(self, name):  # type: ignore[no-untyped-def]
        return getattr(self.f, name)


class SlowStorageIO(TorchCheckpointIO):
    """A user's CheckpointIO writing with torch.save; slow storage while `slow` is set."""

    slow = False

    def save_checkpoint(self, checkpoint, path, storage_options=None):  # type: ignore[no-untyped-def]  # noqa: E501
        if not self.slow:
            return super().save_checkpoint(checkpoint, path, storage_options)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "wb") as fh:
            torch.save(checkpoint, _SlowFile(fh, time.monotonic() + SILENCE_S))
        return None


IO = SlowStorageIO()


class Scenarios(L.Callback):
    """Plays each scenario at its step's end, through Lightning's own calls."""

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):  # type: ignore[no-untyped-def]  # noqa: E501
        step = trainer.global_step
        if step == SLOW_STEP + 1:
            mark("resumed", "slow_data")  # the slow batch was trained on
        name = AT.get(step)
        ckpt = os.path.join(trainer.default_root_dir, f"step{step}.ckpt")
        if name == "stuck_before_collective" and RANK == 1:
            mark("stall", name)
            time.sleep(3600)  # the culprit: never reaches the next collective
        elif name == "save":
            mark("silence", name)
            IO.slow = True
            trainer.save_checkpoint(ckpt)  # rank 0 writes, rank 1 waits in the barrier
            IO.slow = False
            mark("resumed", name)
        elif name == "upload":
            trainer.save_checkpoint(ckpt)
            if RANK == 0:
                mark("silence", name)
                upload()
                mark("resumed", name)
        elif name == "compile":
            mark("silence", name)
            burn(SILENCE_S if RANK == 0 else SILENCE_S / 3)
            mark("resumed", name)

    def on_validation_start(self, trainer, pl_module):  # type: ignore[no-untyped-def]
        if trainer.global_step == EVAL_STEP:
            mark("silence", "eval")

    def on_validation_end(self, trainer, pl_module):  # type: ignore[no-untyped-def]
        if trainer.global_step == EVAL_STEP:
            mark("resumed", "eval")


train = torch.utils.data.DataLoader(Samples(BATCH * 2 * (STEPS + 8)), batch_size=BATCH,
                                    num_workers=1 if SLOW_STEP > 0 else 0)
val = torch.utils.data.DataLoader(Samples(4 * BATCH), batch_size=BATCH)
trainer = L.Trainer(max_steps=STEPS, default_root_dir=sys.argv[1], accelerator="cpu",
                    devices=2, strategy="ddp", enable_progress_bar=True, logger=False,
                    enable_checkpointing=False, plugins=[IO], callbacks=[Scenarios()],
                    num_sanity_val_steps=0, limit_val_batches=1 if EVAL_STEP > 0 else 0,
                    val_check_interval=EVAL_STEP if EVAL_STEP > 0 else None)
trainer.fit(Tiny(), train, val)
print("trained", flush=True)
