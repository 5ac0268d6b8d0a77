"""A tiny real training run on the newest stack: a 1-layer GPT-2 (random init, nothing
downloaded) trained by Lightning on CPU, reporting steps through faultwatch's Lightning
callback. In the attempts listed in FW_FAIL_ATTEMPTS it fails at step 3 with a retryable
network error."""

import os

import lightning as L
import torch
import transformers
from torch.utils.data import DataLoader, TensorDataset

from faultwatch.integrations.lightning import FaultwatchCallback

ATTEMPT = os.environ.get("FAULTWATCH_ATTEMPT", "0")
FAIL_ATTEMPTS = os.environ.get("FW_FAIL_ATTEMPTS", "0").split(",")


class TinyGPT(L.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        cfg = transformers.GPT2Config(vocab_size=64, n_positions=32, n_embd=32, n_layer=1,
                                      n_head=2)
        self.model = transformers.GPT2LMHeadModel(cfg)

    def training_step(self, batch: list[torch.Tensor], _idx: int) -> torch.Tensor:
        out = self.model(input_ids=batch[0], labels=batch[0])
        step = int(self.global_step)
        print(f"step {step} loss {out.loss.item():.4f}", flush=True)
        if ATTEMPT in FAIL_ATTEMPTS and step == 3:
            raise ConnectionError("[Errno 104] Connection reset by peer while fetching shard 3")
        return out.loss

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.AdamW(self.parameters(), lr=1e-3)


def main() -> None:
    torch.manual_seed(0)
    data = DataLoader(TensorDataset(torch.randint(0, 64, (64, 16))), batch_size=8)
    trainer = L.Trainer(max_steps=6, accelerator="cpu", devices=1, logger=False,
                        enable_checkpointing=False, enable_progress_bar=False,
                        enable_model_summary=False, callbacks=[FaultwatchCallback()])
    trainer.fit(TinyGPT(), data)
    print(f"trained attempt {ATTEMPT}: torch {torch.__version__}, transformers "
          f"{transformers.__version__}, lightning {L.__version__}", flush=True)


if __name__ == "__main__":
    main()
