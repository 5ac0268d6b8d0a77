"""Classifying ranks from their Python stacks (py-spy's JSON shape)."""

from __future__ import annotations

from typing import Any

from faultwatch.diagnose.stacks import CHECKPOINT, COLLECTIVE, DATA, analyse, classify

SITE = "/venv/lib/python3.11/site-packages"


def th(*frames: tuple[str, str, int], name: str = "MainThread") -> list[dict[str, Any]]:
    return [{"thread_name": name, "frames": [{"name": n, "filename": f, "line": ln}
                                             for n, f, ln in frames]}]


IN_ALLREDUCE = th(("all_reduce", f"{SITE}/torch/distributed/distributed_c10d.py", 4181),
                  ("wrapper", f"{SITE}/torch/distributed/c10d_logger.py", 83),
                  ("train_step", "/job/train.py", 42))
SLEEPING = th(("<module>", "/job/train.py", 17))
SAVING = th(("_save", f"{SITE}/torch/serialization.py", 900),
            ("save", f"{SITE}/torch/serialization.py", 850),
            ("checkpoint", "/job/train.py", 60))


def test_rank_outside_the_collective_is_the_culprit_with_its_line() -> None:
    f = analyse({0: IN_ALLREDUCE, 1: SLEEPING})
    assert f.culprits == (1,)
    assert f.summary == "rank 0 in all_reduce; rank 1 is at train.py:17 in <module>"
    assert f.ranks[0].at == "train.py:42 in train_step"


def test_positive_control_every_rank_in_collectives() -> None:
    f = analyse({0: IN_ALLREDUCE, 1: IN_ALLREDUCE})
    assert f.culprits == () and f.in_collective == (0, 1)


def test_checkpoint_write_is_recognised() -> None:
    assert classify(0, SAVING).state == CHECKPOINT
    f = analyse({0: SAVING, 1: SAVING})
    assert f.checkpointing and f.culprits == ()
    safet = th(("save_file", f"{SITE}/safetensors/torch.py", 280), ("main", "/job/t.py", 5))
    assert classify(1, safet).state == CHECKPOINT


def test_data_loading_and_main_thread_choice() -> None:
    loader = th(("_next_data", f"{SITE}/torch/utils/data/dataloader.py", 700),
                ("main", "/job/t.py", 9))
    assert classify(0, loader).state == DATA
    threads = th(("run", "/x/threading.py", 1), name="Thread-1") + IN_ALLREDUCE
    assert classify(0, threads).state == COLLECTIVE


def test_junk_is_unknown_not_an_error() -> None:
    assert classify(0, [{"frames": [None, {"line": "x"}]}]).state in ("unknown", "elsewhere")
    assert analyse({}).culprits == ()
