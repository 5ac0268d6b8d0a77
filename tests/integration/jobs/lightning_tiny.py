"""A tiny Lightning job (a linear model on random data, no downloads)."""

import os
import sys

import lightning as L
import torch

from faultwatch.integrations.lightning import FaultwatchCallback


class Tiny(L.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.layer = torch.nn.Linear(8, 1)

    def training_step(self, batch, i):  # type: ignore[no-untyped-def]
        x, y = batch
        return torch.nn.functional.mse_loss(self.layer(x), y)

    def validation_step(self, batch, i):  # type: ignore[no-untyped-def]
        x, y = batch
        return torch.nn.functional.mse_loss(self.layer(x), y)

    def configure_optimizers(self):  # type: ignore[no-untyped-def]
        return torch.optim.SGD(self.parameters(), lr=0.01)


data = torch.utils.data.TensorDataset(torch.randn(64, 8), torch.randn(64, 1))
loader = torch.utils.data.DataLoader(data, batch_size=8)
trainer = L.Trainer(max_epochs=2, default_root_dir=sys.argv[1], accelerator="cpu",
                    enable_progress_bar=True, logger=False, val_check_interval=4,
                    callbacks=[FaultwatchCallback()], limit_val_batches=2,
                    max_steps=int(os.environ.get("STEPS", "12")))
trainer.fit(Tiny(), loader, loader)
print("trained", flush=True)
