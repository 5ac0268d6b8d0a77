"""The matcher's native fast path (rules/native.py, native/src/lib.rs) gives exactly the exact
path's results (Matcher._exact_batch: the pure-Python reference) on random batches, and takes
the batches it should."""

from __future__ import annotations

import random

import pytest

from faultwatch.core.events import Line
from faultwatch.rules import Matcher
from faultwatch.rules.normalise import PREFIX_RUN, normalise_line
from faultwatch.rules.patterns import anchor_after_prefix
from tests.support.rules import builtin_ruleset

RS = builtin_ruleset()
FAST = Matcher(RS).fast
needs_native = pytest.mark.skipif(FAST is None, reason="the native fast path is not built here "
                                  "(no cargo at install, FAULTWATCH_NO_NATIVE, or no hyperscan)")


def pair() -> tuple[Matcher, Matcher]:
    """(a matcher with the fast path, one with the exact path alone)"""
    fast, exact = Matcher(RS), Matcher(RS)
    exact.fast = None
    return fast, exact


def took(m: Matcher, texts: list[str], d: int | None) -> bool:
    """Whether the fast path reads the batch (declined, or a rule hit: the exact path)."""
    got = m.fast.scan(texts, [float(i) for i in range(len(texts))], d)
    return got is not None and not m._scan_x_own(got[0])  # noqa: SLF001


PREFIXES = ["", "", "", "", "", "[rank0]:", "[rank1]: ", "[default2]:", "[default0]:[rank3]:",
            "[rank12]:", "x[rank1]:", "[2024-01-01] ", "[W x] ", "[stderr]",
            "[2025-04-09 17:15:22] ", "2025-04-09T17:15:22.123456789Z ", "3: ", "[Rank 2] ",
            "(RayTrainWorker pid=12, ip=10.0.0.1) ", "[12345.678901] ", "[worker-1] ",
            "[stdout] [2025-04-09 17:15:22] [worker-1] ", "[stderr][rank1]:"]
QUIET = ["iteration      5/  100 | lm loss: 2.0 |",
         " 45%|####      | 45/100 [00:10<00:12,  4.5it/s]", "hello", "{'loss': 1.2}",
         "Step 7/100 | loss 1", "ünïcode ok"]
LOUD = ["RuntimeError: CUDA out of memory.", "saving checkpoint at iteration 39 to /c",
        "Traceback (most recent call last):", '  File "a.py", line 3, in <module>',
        "ImportError: no module named x",
        "ConnectionResetError: [Errno 104] Connection reset by peer", "tokens [rank5]: mid"]


def test_anchor_after_prefix() -> None:
    run = PREFIX_RUN
    assert anchor_after_prefix("^foo$") == "^" + run + "foo$"
    assert anchor_after_prefix(r"(?:^|[\s|])x") == "(?:^" + run + r"|[\s|])x"
    for unchanged in (r"\^x", "[^a]b", "[]^]y", "a^"[:1]):
        assert anchor_after_prefix(unchanged) == unchanged


@needs_native
def test_fast_path_matches_exact_path() -> None:
    fast, exact = pair()
    rnd = random.Random(3)
    used = 0
    for _ in range(3000):
        n = rnd.randint(1, 40)
        loud = rnd.random() < 0.2
        texts = [rnd.choice(PREFIXES) + rnd.choice(QUIET + LOUD if loud else QUIET)
                 for _ in range(n)]
        lines = [Line(rnd.choice(["stdout", "stderr"]), i, float(i), t)
                 for i, t in enumerate(texts)]
        d = rnd.choice([None, 0, 3])
        used += took(fast, texts, d)
        assert fast.match_lines(lines, default_rank=d) == exact.match_lines(lines,
                                                                           default_rank=d), texts
    assert used > 100


# prefixes as launchers and shippers stack them (normalise.PREFIX_KINDS), with lookalikes
STACKABLE = ["", "[rank3]:", "[rank1]: ", "[default0]:", "3: ", " 12: ", "[Rank 2] ",
             "[1,4]<stdout>:", "2025-04-09T17:15:22.123456789Z ", "[2025-04-09 17:15:22] ",
             "[stderr]", "[stdout] ", "[worker-1] ", "[pod/p-0/c] ", "(pid=12) ",
             "Apr  9 17:15:22 n1 kernel: ", "trainer-1  | ", "[12345.678901] ", "kernel: ",
             "[\u0663]: ", "\u0663: ", "[rank\u0663]:", "x ", "[W x] ", "py:464: ", "[INFO] "]
BODIES = QUIET + ["", "\u00fc\u00f1\u00ee 3: \u00e7\u00f8d\u00e9", " 45%|####  | 45/100\r"
                  " 46%|####  | 46/100 [00:10<00:12,  4.5it/s]", "a\rb", "step 12: ok",
                  "[log_dist] [Rank 0] time (ms)", "x[rank1]: merged", "\u6b65 7/100 [00",
                  "held\n[rank5]:newline", "two\n3: lines"]


def _batch(rnd: random.Random, stack_max: int, loud: bool) -> list[str]:
    n = rnd.randint(1, 60)
    # mostly one launcher's prefix on every line (srun -l, kubectl --timestamps), sometimes
    # a mix of everything
    fixed = [rnd.choice(STACKABLE) for _ in range(rnd.randint(0, stack_max))]
    mixed = rnd.random() < 0.4
    out = []
    for _ in range(n):
        pre = [rnd.choice(STACKABLE) for _ in range(rnd.randint(0, stack_max))] if mixed \
            else fixed
        body = rnd.choice(BODIES + LOUD if loud and rnd.random() < 0.3 else BODIES)
        out.append("".join(pre) + body)
    return out


@needs_native
def test_fast_path_matches_exact_path_on_prefixed_batches() -> None:
    """Randomized batches where every line carries launcher prefixes (stacked, unicode,
    CR inside lines, empty lines, lookalikes): both paths give the same MatchBatch."""
    fast, exact = pair()
    rnd = random.Random(11)
    used = quiet = 0
    for k in range(2500):
        loud = k % 5 == 0
        texts = _batch(rnd, 3, loud)
        lines = [Line(rnd.choice(["stdout", "stderr"]), i, float(i), t)
                 for i, t in enumerate(texts)]
        d = rnd.choice([None, 0, 3])
        taken = took(fast, texts, d)
        used += taken
        quiet += not loud
        got = fast.match_lines(lines, default_rank=d)
        want = exact.match_lines(lines, default_rank=d)
        assert got == want, texts
        assert got.ranks == tuple(normalise_line(t, d).rank for t in texts) or not taken, texts
    assert used > 60, (used, quiet)  # the fast path was exercised (seeded: 91)


LAUNCHERS = {  # what one launcher puts before every line, by line number
    "srun -l": lambda i: f"{i % 12:>2}: ",
    "torchrun --tee": lambda i: f"[default{i % 8}]:",
    "torch [rankN]:": lambda i: f"[rank{i % 8}]:",
    "srun -l + tee": lambda i: f"{i % 3}: [default{i % 8}]:",
    "kubectl --timestamps": lambda i: f"2025-04-09T17:15:{i % 60:02d}.{i:09d}Z ",
    "k8s + srun -l": lambda i: f"2025-04-09T17:15:{i % 60:02d}.{i:09d}Z {i % 4}: ",
    "DeepSpeed": lambda i: f"[Rank {i % 8}] ",
    "mpirun --tag-output": lambda i: f"[1,{i % 4}]<stdout>:",
    "none": lambda i: "",
}


@needs_native
def test_prefixed_quiet_batches_take_the_fast_path() -> None:
    """A quiet batch where every line carries one launcher's prefix is handled by the fast
    path, with the exact path's result."""
    fast, exact = pair()
    rnd = random.Random(13)
    for name, prefix in LAUNCHERS.items():
        for _ in range(20):
            texts = [prefix(i) + rnd.choice(QUIET + ["", "a\rb", "\u00fc 3/4"])
                     for i in range(rnd.randint(1, 80))]
            lines = [Line("stdout", i, float(i), t) for i, t in enumerate(texts)]
            d = rnd.choice([None, 0, 3])
            assert took(fast, texts, d), (name, texts)
            got = fast.match_lines(lines, default_rank=d)
            assert got == exact.match_lines(lines, default_rank=d), (name, texts)
            assert got.ranks == tuple(normalise_line(t, d).rank for t in texts), (name, texts)


def test_each_ranks_last_step_wherever_it_is_in_the_batch() -> None:
    """Progress is each rank's last step in the batch, also when it lies far before the
    batch's tail (a rank that went quiet) or only in an earlier line than other ranks'."""
    fast, exact = pair()
    rnd = random.Random(14)
    for _ in range(300):
        n = rnd.randint(1, 200)
        want: dict[int | None, int] = {}
        texts = []
        for i in range(n):
            rank = rnd.choice([None, 0, 1, 2, 5])
            pre = "" if rank is None else rnd.choice([f"[rank{rank}]:", f"{rank}: "])
            if rnd.random() < 0.05:
                texts.append(f"{pre}step {i}/1000 | loss 1.5")
                want[rank] = i
            else:
                texts.append(pre + rnd.choice(["hello", "", "data worker 3 ready"]))
        lines = [Line("stdout", i, float(i), t) for i, t in enumerate(texts)]
        for m in (fast, exact):
            got = {p.rank: p.step for p in m.match_lines(lines, default_rank=None).progress}
            assert got == want, texts
