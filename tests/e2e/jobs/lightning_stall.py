"""A tiny Lightning job run as users run it: no faultwatch code, Lightning's default progress
bar (rich when installed: it draws nothing while the output is no terminal, so the job is
silent from its model summary to its end).

A linear model on random data, DDP over gloo (CPU) under torchrun.
- FW_STALL_AT=N: rank FW_RANK stops for good after batch N (the others wait in the next
  collective); 0: never.
- FW_SAVE_AT=N: a checkpoint (ModelCheckpoint, rank 0 writes while the others wait in its
  barrier) after step N, written by torch.save through a crawling file: FW_SAVE_S seconds
  inside torch.save; 0: no checkpoint.
Marks (`<event> <rank> <unix time>` lines) go to the file $FW_MARKS, never to the output.
"""

import os
import sys
import time

import lightning as L
import torch
from lightning.pytorch.callbacks import ModelCheckpoint
from lightning.pytorch.plugins.io import TorchCheckpointIO

STALL_AT = int(os.environ.get("FW_STALL_AT", "25"))
SAVE_AT = int(os.environ.get("FW_SAVE_AT", "0"))
SAVE_S = float(os.environ.get("FW_SAVE_S", "60"))
STUCK_RANK = int(os.environ.get("FW_RANK", "1"))
RANK = int(os.environ.get("RANK", "0"))


def mark(event: str) -> None:
    if os.environ.get("FW_MARKS"):
        with open(os.environ["FW_MARKS"], "a") as f:
            f.write(f"{event} {RANK} {time.time()}\n")


class Tiny(L.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.layer = torch.nn.Linear(8, 1)

    def training_step(self, batch, i):  # type: ignore[no-untyped-def]
        x, y = batch
        time.sleep(0.05)  # a step that takes a little time, like real ones
        return torch.nn.functional.mse_loss(self.layer(x), y)

    def configure_optimizers(self):  # type: ignore[no-untyped-def]
        return torch.optim.SGD(self.parameters(), lr=0.01)


class Stall(L.Callback):
    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):  # type: ignore[no-untyped-def]  # noqa: E501
        if RANK == STUCK_RANK and trainer.global_step == STALL_AT:
            mark("stall")
            time.sleep(3600)  # the culprit: never reaches the next collective


class _SlowFile:
    """A file on crawling shared storage: its first write waits until FW_SAVE_S have passed
    since the save began (inside torch.save, as a slow filesystem would)."""

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
    """A user's CheckpointIO writing with torch.save to slow storage."""

    def save_checkpoint(self, checkpoint, path, storage_options=None):  # type: ignore[no-untyped-def]  # noqa: E501
        os.makedirs(os.path.dirname(path), exist_ok=True)
        mark("save")
        with open(path, "wb") as fh:
            torch.save(checkpoint, _SlowFile(fh, time.monotonic() + SAVE_S))
        mark("saved")


saving = [ModelCheckpoint(every_n_train_steps=SAVE_AT, save_top_k=-1)] if SAVE_AT else []
data = torch.utils.data.TensorDataset(torch.randn(4096, 8), torch.randn(4096, 1))
loader = torch.utils.data.DataLoader(data, batch_size=8)
trainer = L.Trainer(max_steps=int(os.environ.get("STEPS", "60")), default_root_dir=sys.argv[1],
                    accelerator="cpu", devices=2, strategy="ddp", enable_progress_bar=True,
                    logger=False, enable_checkpointing=bool(SAVE_AT),
                    plugins=[SlowStorageIO()] if SAVE_AT else [],
                    callbacks=[Stall(), *saving])
trainer.fit(Tiny(), loader)
print("trained", flush=True)
