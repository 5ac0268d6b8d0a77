"""A tiny Hugging Face Trainer job run as users run it: no faultwatch code, default tqdm bar,
logs every step. GPT-2 built from a config (nothing downloaded), random tokens, CPU.

- FW_NAN_AT=N: after step N the weights become NaN (a diverged optimizer would leave them
  so), and every later logged loss is NaN; 0: a healthy run.
- STEPS: optimizer steps (default 12).
- FW_STEP_SLEEP_S: seconds each step takes at least (a decision can act while it runs).
"""

import math
import os
import sys
import time

import torch
from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainerCallback, TrainingArguments

NAN_AT = int(os.environ.get("FW_NAN_AT", "0"))
STEP_SLEEP_S = float(os.environ.get("FW_STEP_SLEEP_S", "0"))


class Tokens(torch.utils.data.Dataset):
    def __len__(self) -> int:
        return 4096

    def __getitem__(self, i: int) -> dict:
        ids = torch.randint(0, 64, (16,), generator=torch.Generator().manual_seed(i))
        return {"input_ids": ids, "labels": ids.clone()}


class Diverge(TrainerCallback):
    def on_step_end(self, args, state, control, model=None, **kwargs):  # noqa: ANN001, ANN003, ANN201
        if NAN_AT and state.global_step == NAN_AT and model is not None:
            with torch.no_grad():
                for p in model.parameters():
                    p.fill_(math.nan)
        if STEP_SLEEP_S:
            time.sleep(STEP_SLEEP_S)


torch.manual_seed(0)
model = GPT2LMHeadModel(GPT2Config(vocab_size=64, n_positions=16, n_embd=16, n_layer=1,
                                   n_head=2, bos_token_id=0, eos_token_id=0))
args = TrainingArguments(output_dir=sys.argv[1], per_device_train_batch_size=8,
                         max_steps=int(os.environ.get("STEPS", "12")), logging_steps=1,
                         save_strategy="no", report_to=[], use_cpu=True, disable_tqdm=False,
                         dataloader_num_workers=0)
Trainer(model=model, args=args, train_dataset=Tokens(), callbacks=[Diverge()]).train()
print("trained", flush=True)
