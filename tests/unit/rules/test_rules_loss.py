"""Loss values read from the frameworks' own log lines (rules/loss.py), through the matcher,
the signals and the wire."""

from __future__ import annotations

import math
import re

import pytest

from faultwatch.core.events import Line, LossBatch
from faultwatch.core.matching import signals_of_lines
from faultwatch.rules.classify import matcher_for
from faultwatch.rules.loss import LossScanner, parse_loss
from faultwatch.wire import signal_dict
from faultwatch.wire.signals import decode_signals, encode_signal
from tests.support.rules import builtin_ruleset


@pytest.mark.parametrize(("line", "key", "value"), [
    # transformers ProgressCallback/PrinterCallback: str(logs), floats as f"{v:.4g}"
    ("{'loss': '2.346', 'grad_norm': '1.25', 'learning_rate': '5e-05', 'epoch': '0.12'}",
     "loss", 2.346),
    ("{'loss': 'nan', 'grad_norm': 'nan', 'learning_rate': '5e-05', 'epoch': '0.5'}",
     "loss", math.nan),
    ("{'loss': nan, 'grad_norm': nan, 'learning_rate': 1e-05, 'epoch': 0.1}", "loss", math.nan),
    # Lightning's Tqdm.format_num pads to 5 characters: nan -> "nan.0"
    ("Epoch 0:  40%|████      | 4/10 [00:01<00:02,  2.90it/s, v_num=0, train_loss=nan.0]",
     "train_loss", math.nan),
    ("Epoch 1: 100%|██| 8/8 [00:02<00:00, v_num=1, train_loss_step=2.310, train_loss_epoch=2.5]",
     "train_loss_step", 2.31),
    (" iteration      100/  500000 | lm loss: 2.345E+00 | loss scale: 65536.0 |", "lm_loss",
     2.345),
    # ... and with the default logging_nan_inf_filter a NaN window logs 0 beside a NaN norm
    ("{'loss': '0', 'grad_norm': 'nan', 'learning_rate': '2.5e-05', 'epoch': '0.01367'}",
     "loss(hf-nan-filtered)", math.nan),
    ("step 12 loss=inf", "loss", math.inf),
    ("Loss = -inf", "loss", -math.inf),
    ("step 3 loss: 100", "loss", 100.0),
])
def test_parse_training_loss(line: str, key: str, value: float) -> None:
    got = parse_loss(line)
    assert got is not None and got[0] == key
    assert (math.isnan(got[1]) and math.isnan(value)) or got[1] == value


@pytest.mark.parametrize("line", [
    "{'eval_loss': 1.234, 'eval_runtime': 12.3, 'epoch': 1.0}", "val_loss=3.1",
    "loss scale: 1.0", "loss_scale: 1024", " validation loss at iteration 1000 | lm loss PPL: 8.2",
    "compute the loss with a new function", "no_loss=2",
])
def test_other_series_and_words_are_no_training_loss(line: str) -> None:
    assert parse_loss(line) is None


@pytest.mark.parametrize("line", [
    # an fp16 overflow step: inf grad norm, finite loss; a zero loss with a finite norm
    "{'loss': '2.31', 'grad_norm': 'inf', 'learning_rate': '5e-05', 'epoch': '0.1'}",
    "{'loss': '0', 'grad_norm': '0.5', 'learning_rate': '5e-05', 'epoch': '0.1'}",
])
def test_finite_losses_stay_finite(line: str) -> None:
    got = parse_loss(line)
    assert got is not None and math.isfinite(got[1])


def test_matcher_batch_carries_each_ranks_losses_in_order_and_the_wire_keeps_nan() -> None:
    m = matcher_for(builtin_ruleset())
    texts = ["[rank0]:{'loss': '2.5', 'epoch': '0.1'}", "[rank1]:hello",
             "[rank1]:{'loss': 'nan', 'epoch': '0.1'}", "[rank0]:{'eval_loss': 'nan'}",
             "[rank0]:step 4 loss=2.4"]
    lines = [Line("stdout", i, 100.0 + i, t) for i, t in enumerate(texts)]
    sigs = signals_of_lines("j", 0, "n0", lines, m)
    lb = [s for s in sigs if isinstance(s, LossBatch)]
    assert len(lb) == 1
    got = [(x.rank, x.ts, x.key, "nan" if math.isnan(x.value) else x.value) for x in lb[0].marks]
    # rank 1's NaN (the non-finite scan), each rank's last loss of the batch (the tail sample)
    assert got == [(1, 102.0, "loss", "nan"), (0, 104.0, "loss", 2.4)]
    back = decode_signals(encode_signal(lb[0]))
    assert isinstance(back, list) and isinstance(back[0], LossBatch)
    assert math.isnan(back[0].marks[0].value) and signal_dict(back[0])["t"] == "loss"
    # a batch without loss lines has no LossBatch (a positive control above)
    plain = [Line("stdout", i, 1.0, f"[rank0]:step {i}") for i in range(50)]
    assert not [s for s in signals_of_lines("j", 0, "n0", plain, m)
                if isinstance(s, LossBatch)]


def test_a_long_batch_gives_its_first_nan_and_each_ranks_last_loss() -> None:
    """A loss on every line costs a parse per rank and batch, not per line; a NaN anywhere
    in the batch is found (the scan), finite values are sampled at the batch's end."""
    sc = LossScanner()
    texts = [f"loss={2 + i / 1000:.3f}" for i in range(100)]
    texts[10] = "loss=nan"
    texts[11] = "loss=inf"  # the same rank: its first non-finite value is enough
    texts[50] = "[rank3]:loss=1.5"
    lines = [Line("stdout", i, float(i), t) for i, t in enumerate(texts)]
    ranks = [3 if i == 50 else 0 for i in range(100)]
    marks = sc.scan(lines, ranks)
    assert [(m.rank, m.ts, "nan" if math.isnan(m.value) else m.value) for m in marks] == [
        (0, 10.0, "nan"), (3, 50.0, 1.5), (0, 99.0, 2.099)]
    healthy = [Line("stdout", i, float(i), f"step {i} | lm loss: 2.0{i % 10} | loss scale: 1.0")
               for i in range(500)]
    assert [(m.ts, m.value) for m in sc.scan(healthy, ())] == [(499.0, 2.09)]


def test_the_quick_reject_never_changes_a_parse(monkeypatch: pytest.MonkeyPatch) -> None:
    """parse_loss' quick reject (a literal search on the lowercased ASCII line) only skips
    lines the full parse would refuse: same answers with and without it, on lines built
    from loss keys in any case, separators, values and lookalikes (non-ASCII too)."""
    import random

    from faultwatch.rules import loss

    parts = ["loss", "LOSS", "Loss", "lm loss", "train/loss", "loss_step", "val_loss", "'",
             '"', " ", "\t", "\x1c", ":", "=", ": ", "2.31", "nan", "inf.0", "0", "-1e-3",
             "'grad_norm': nan", ", ", "lo\u017fs", "\u00e9", "step 3", "|", "x", "_"]
    rnd = random.Random(31)
    keys = ["loss", "LOSS", "Loss_Step", "lm loss", "train/loss", "val_loss", "lo\u017fs"]
    seps = [":", "=", ": ", " = ", "':", "\t:", "\x1c=", " ", "::"]
    vals = ["2.31", "nan", "inf.0", "'0'", "-1e-3", "x", ""]

    def junk() -> str:
        return "".join(rnd.choice(parts) for _ in range(rnd.randint(0, 4)))

    lines = [junk() + (rnd.choice(keys) + rnd.choice(seps) + rnd.choice(vals)
                       if rnd.random() < 0.7 else "") + junk() for _ in range(20000)]
    got = [parse_loss(t) for t in lines]
    monkeypatch.setattr(loss, "_CANDIDATE", re.compile(""))  # (always a candidate)
    want = [parse_loss(t) for t in lines]
    assert [repr(g) for g in got] == [repr(w) for w in want]  # (repr: nan == nan)
    assert sum(g is not None for g in got) > 2000  # both answers are common (seeded)
    assert sum(g is None for g in got) > 3000


def test_skipping_the_tail_without_a_candidate_never_changes_a_scan(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """With hyperscan the batch scan also says whether any line holds a loss candidate; a
    batch without one (on ASCII lines) skips the tail loop: the same marks as a scanner
    whose candidate pattern fires on every batch, on batches of step lines, loss lines of
    any shape and case, separators str's `\\s` takes, lookalikes and non-ASCII lines."""
    import random

    from faultwatch.rules import loss

    rnd = random.Random(7)
    shapes = ["step {s} | loss {v} | lr 3e-4", "step {s} loss={v}", "{{'loss': '{v}'}}",
              "lm loss: {v} |", "Loss = {v}", "LOSS:{v}", "val_loss={v}", "lo\u017fs: {v}",
              "train/loss {v}", "loss\x1c={v}", "loss_step= {v}", "no loss here {v}",
              "Loss_Step\t:{v}", "loss\xa0: {v}", "loss_\u017ftep: {v}", "\u00e9tape {s}"]
    quiet = [shapes[0], "no loss here {v}", "train/loss {v}"]  # (no candidate in a batch)
    batches = []
    for _ in range(400):
        n = rnd.randint(1, 90)
        pick = shapes if rnd.random() < 0.6 else quiet
        texts = [rnd.choice(pick).format(s=i, v=rnd.choice(["2.31", "nan", "0", "x"]))
                 for i in range(n)]
        ranks = [rnd.randrange(3) for _ in range(n)] if rnd.random() < 0.7 else []
        batches.append(([Line("stdout", i, float(i), t) for i, t in enumerate(texts)], ranks))
    for texts in (["loss_\u017ftep: 2.5", "step 1 | loss 2"], ["loss\xa0: 2.5"],
                  ["x"] * 70 + ["loss=3"], ["loss=3"] + ["x"] * 70, ["Loss\x1f=4"]):
        batches.append(([Line("stdout", i, float(i), t) for i, t in enumerate(texts)], []))

    def marks(sc: LossScanner) -> list[str]:
        return [repr(sc.scan(lines, ranks)) for lines, ranks in batches]

    got = marks(LossScanner())
    monkeypatch.setattr(loss, "CANDIDATE_SCAN", r"[\s\S]")  # (a candidate in every batch)
    assert got == marks(LossScanner())
    assert sum(g != "()" for g in got) > 150 and sum(g == "()" for g in got) > 50
