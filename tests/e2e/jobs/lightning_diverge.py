"""A tiny Lightning job run as users run it: no faultwatch code, one process on CPU, the loss
logged to the progress bar (`self.log("train_loss", ..., prog_bar=True)`) of Lightning's
TQDMProgressBar -- its default where rich is not installed; the rich bar draws nothing while
the output is no terminal (tests/e2e/jobs/hang_matrix_lightning.py). The bar prints
`train_loss=nan.0` once the loss is NaN (Tqdm.format_num pads to 5 characters).

- FW_NAN_AT=N: after step N the weights become NaN (a diverged optimizer would leave them
  so); 0: a healthy run.
- STEPS: optimizer steps (default 30).
"""

import math
import os
import sys
import time

import lightning as L
import torch
from lightning.pytorch.callbacks import TQDMProgressBar

NAN_AT = int(os.environ.get("FW_NAN_AT", "0"))


class Tiny(L.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.layer = torch.nn.Linear(8, 1)

    def training_step(self, batch, i):  # type: ignore[no-untyped-def]
        x, y = batch
        loss = torch.nn.functional.mse_loss(self.layer(x), y)
        self.log("train_loss", loss, prog_bar=True)
        time.sleep(0.05)  # a step that takes a little time, like real ones
        return loss

    def configure_optimizers(self):  # type: ignore[no-untyped-def]
        return torch.optim.SGD(self.parameters(), lr=0.01)


class Diverge(L.Callback):
    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):  # type: ignore[no-untyped-def]  # noqa: E501
        if NAN_AT and trainer.global_step == NAN_AT:
            with torch.no_grad():
                for p in pl_module.parameters():
                    p.fill_(math.nan)


torch.manual_seed(0)
data = torch.utils.data.TensorDataset(torch.randn(4096, 8), torch.randn(4096, 1))
trainer = L.Trainer(max_steps=int(os.environ.get("STEPS", "30")), default_root_dir=sys.argv[1],
                    accelerator="cpu", devices=1, logger=False, enable_checkpointing=False,
                    callbacks=[TQDMProgressBar(), Diverge()])
trainer.fit(Tiny(), torch.utils.data.DataLoader(data, batch_size=8))
print("trained", flush=True)
