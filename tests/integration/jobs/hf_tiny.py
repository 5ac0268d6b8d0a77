"""A tiny Hugging Face Trainer job (GPT-2 built from a config, random tokens, no downloads)."""

import os
import sys

import torch
from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainingArguments

from faultwatch.integrations.huggingface import FaultwatchCallback


class Tokens(torch.utils.data.Dataset):
    def __len__(self) -> int:
        return 64

    def __getitem__(self, i: int) -> dict:
        ids = torch.randint(0, 64, (16,), generator=torch.Generator().manual_seed(i))
        return {"input_ids": ids, "labels": ids.clone()}


model = GPT2LMHeadModel(GPT2Config(vocab_size=64, n_positions=16, n_embd=16, n_layer=1,
                                   n_head=2, bos_token_id=0, eos_token_id=0))
args = TrainingArguments(output_dir=sys.argv[1], per_device_train_batch_size=8,
                         max_steps=int(os.environ.get("STEPS", "12")), save_steps=5,
                         eval_strategy="steps", eval_steps=4, logging_steps=2,
                         report_to=[], use_cpu=True, disable_tqdm=False)
Trainer(model=model, args=args, train_dataset=Tokens(), eval_dataset=Tokens(),
        callbacks=[FaultwatchCallback()]).train()
print("trained", flush=True)
