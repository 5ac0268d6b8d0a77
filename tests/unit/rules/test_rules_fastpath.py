"""The matcher's fast path (one scan, prefixes left on) gives exactly the exact path's results."""

from __future__ import annotations

import random

from faultwatch.core.events import Line
from faultwatch.rules import Matcher, load_ruleset
from faultwatch.rules.normalise import PREFIX_RUN
from faultwatch.rules.patterns import anchor_after_prefix
from faultwatch.rules.prefix import strip_fast, strip_joined

RS = load_ruleset()
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


def test_strip_fast_equals_strip_joined() -> None:
    rnd = random.Random(1)
    toks = ["[rank0]:", "[rank1]: ", "[default2]:", "[trainer3]:", "[x]:", "[2024-01]", "abc",
            "", " Traceback", "[rank1]:[rank0]:", "[default0]:[rank5]: "]
    for _ in range(5000):
        n = rnd.randint(1, 8)
        texts = ["".join(rnd.choice(toks) for _ in range(rnd.randint(0, 3))) for _ in range(n)]
        joined = "\n".join(texts)
        d = rnd.choice([None, 0, 5])
        assert strip_fast(joined, n, d) == strip_joined(joined, n, d), texts


def test_fast_path_matches_exact_path() -> None:
    fast, exact = Matcher(RS), Matcher(RS)
    if not fast._fast:  # noqa: SLF001 - re2 engine: there is only the exact path
        return
    exact._fast = False  # noqa: SLF001
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
        used += fast._fast_batch(lines, texts, "\n".join(texts), d) is not None  # noqa: SLF001
        assert fast.match_lines(lines, default_rank=d) == exact.match_lines(lines,
                                                                           default_rank=d), texts
    assert used > 100
