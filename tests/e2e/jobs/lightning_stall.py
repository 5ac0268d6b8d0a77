"""A tiny Lightning job run as users run it: no faultwatch code, Lightning's default tqdm bar.

A linear model on random data, DDP over gloo (CPU) under torchrun.
- FW_STALL_AT=N: rank FW_RANK stops for good after batch N (the others wait in the next
  gradient all-reduce); 0: never.
Marks (`<event> <rank> <unix time>` lines) go to the file $FW_MARKS, never to the output.
"""

import os
import sys
import time

import lightning as L
import torch

STALL_AT = int(os.environ.get("FW_STALL_AT", "25"))
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
            time.sleep(3600)  # the culprit: never reaches the next all-reduce


data = torch.utils.data.TensorDataset(torch.randn(4096, 8), torch.randn(4096, 1))
loader = torch.utils.data.DataLoader(data, batch_size=8)
trainer = L.Trainer(max_steps=int(os.environ.get("STEPS", "60")), default_root_dir=sys.argv[1],
                    accelerator="cpu", devices=2, strategy="ddp", enable_progress_bar=True,
                    logger=False, enable_checkpointing=False, callbacks=[Stall()])
trainer.fit(Tiny(), loader)
print("trained", flush=True)
