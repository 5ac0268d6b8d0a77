"""The matcher's fast path (one scan, prefixes left on) gives exactly the exact path's results."""

from __future__ import annotations

import random

from faultwatch.core.events import Line
from faultwatch.rules import Matcher
from faultwatch.rules.engine import _last_index
from faultwatch.rules.normalise import (
    PREFIX_RUN,
    line_ranks,
    normalise_line,
    prefix_ranks,
    strip_prefixes,
)
from faultwatch.rules.patterns import anchor_after_prefix
from faultwatch.rules.prefix import strip_fast, strip_joined
from tests.support.rules import builtin_ruleset

RS = builtin_ruleset()
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


def test_fast_path_matches_exact_path_on_prefixed_batches() -> None:
    """Randomized batches where every line carries launcher prefixes (stacked, unicode,
    CR inside lines, empty lines, lookalikes): both paths give the same MatchBatch."""
    fast, exact = Matcher(RS), Matcher(RS)
    if not fast._fast:  # noqa: SLF001 - re2 engine: there is only the exact path
        return
    exact._fast = False  # noqa: SLF001
    rnd = random.Random(11)
    used = quiet = 0
    for k in range(2500):
        loud = k % 5 == 0
        texts = _batch(rnd, 3, loud)
        lines = [Line(rnd.choice(["stdout", "stderr"]), i, float(i), t)
                 for i, t in enumerate(texts)]
        d = rnd.choice([None, 0, 3])
        took = fast._fast_batch(lines, texts, "\n".join(texts), d) is not None  # noqa: SLF001
        used += took
        quiet += not loud
        got = fast.match_lines(lines, default_rank=d)
        want = exact.match_lines(lines, default_rank=d)
        assert got == want, texts
        assert got.ranks == tuple(normalise_line(t, d).rank for t in texts) or not took, texts
    assert used > 100, (used, quiet)  # the fast path was exercised (seeded: 136)


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


def test_prefixed_quiet_batches_take_the_fast_path() -> None:
    """A quiet batch where every line carries one launcher's prefix is handled by the fast
    path (it used to go to the exact path, ~5x slower), with the exact path's result."""
    fast, exact = Matcher(RS), Matcher(RS)
    if not fast._fast:  # noqa: SLF001 - re2 engine: there is only the exact path
        return
    exact._fast = False  # noqa: SLF001
    rnd = random.Random(13)
    for name, prefix in LAUNCHERS.items():
        for _ in range(20):
            texts = [prefix(i) + rnd.choice(QUIET + ["", "a\rb", "\u00fc 3/4"])
                     for i in range(rnd.randint(1, 80))]
            lines = [Line("stdout", i, float(i), t) for i, t in enumerate(texts)]
            d = rnd.choice([None, 0, 3])
            assert fast._fast_batch(lines, texts, "\n".join(texts), d) is not None, (  # noqa: SLF001
                name, texts)
            got = fast.match_lines(lines, default_rank=d)
            assert got == exact.match_lines(lines, default_rank=d), (name, texts)
            assert got.ranks == tuple(normalise_line(t, d).rank for t in texts), (name, texts)


def test_prefix_ranks_and_line_ranks_equal_normalise_line() -> None:
    rnd = random.Random(12)
    cache: dict[str, int] = {}
    for _ in range(4000):
        texts = _batch(rnd, 4, False)
        d = rnd.choice([None, 0, 5])
        want = [normalise_line(t, d).rank for t in texts]
        assert line_ranks(texts, d) == want, texts
        named = prefix_ranks("\n".join(texts), len(texts), cache, check_mid=False)
        if any("\n" in t for t in texts):
            continue
        assert named is not None, texts
        assert [named.get(i, d) for i in range(len(texts))] == want, texts


def test_strip_prefixes_equals_normalise_line() -> None:
    """The progress path's one-match strip gives normalise_line's text, also past
    MAX_STACK prefixes, on lookalikes, unicode digits and lines holding a newline."""
    rnd = random.Random(15)
    stripped = 0
    for _ in range(4000):
        for t in _batch(rnd, 10, True):
            got = strip_prefixes(t)
            assert got == normalise_line(t).text, t
            stripped += got != t
    assert stripped > 1000


def test_each_ranks_last_step_wherever_it_is_in_the_batch() -> None:
    """Progress is each rank's last step in the batch, also when it lies far before the
    batch's tail (a rank that went quiet) or only in an earlier line than other ranks'."""
    fast, exact = Matcher(RS), Matcher(RS)
    exact._fast = False  # noqa: SLF001
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


def test_one_carrier_per_line_reading_equals_the_general_one() -> None:
    """_carried_ranks' shortcut (as many carriers as lines, none holding a newline) gives
    the general reading's ranks and runs, and declines where that reading is needed."""
    fast, general = Matcher(RS), Matcher(RS)
    if not fast._fast:  # noqa: SLF001 - re2 engine: no carried scan
        return
    general._one_carrier_per_line = lambda *_: None  # type: ignore[method-assign]  # noqa: SLF001
    carriers = ["[rank{r}]:", "[rank{r}]: ", "[default{r}]:", "{r}: ", " {r}: ", "[Rank {r}] ",
                "[1,{r}]<stdout>:", "[stderr][rank{r}]:", "2025-04-09T17:15:22Z {r}: ",
                "[worker-1] ", "x[rank{r}]:", "[\u0663]: ", "", "[default0]:[rank{r}]:",
                "[" + "x" * 140 + "{r}]: ", "Apr  9 17:15:22 n1 {r}: "]
    rnd = random.Random(16)
    used = 0
    real = fast._one_carrier_per_line  # noqa: SLF001
    for _ in range(1500):
        pool = rnd.sample(carriers, rnd.randint(1, 2))
        odd = ["held\nnewline", "held\n[rank5]:newline", "7: x"] if rnd.random() < 0.2 else []
        texts = [rnd.choice(pool).format(r=rnd.randint(0, 300)) + rnd.choice(QUIET + odd)
                 for _ in range(rnd.randint(1, 50))]
        joined = "\n".join(texts)
        data = joined.encode()
        carried = fast.carrier_hits(data)[0]
        d = rnd.choice([None, 0, 3])
        args = (texts, data, len(data) == len(joined), carried, d)
        assert fast._carried_ranks(*args) == general._carried_ranks(*args), texts  # noqa: SLF001
        used += len(carried) == len(texts) and "\n" not in "".join(texts) and \
            real(data, carried) is not None
    assert used > 200, used


def test_last_index_keeps_each_ranks_last_line_in_first_seen_order() -> None:
    """The fast path's per-rank last line (its order becomes the order of an Output's
    rank_last_ts): as dict(zip(ranks, range(n))) gives it, order included."""
    rnd = random.Random(17)
    for _ in range(2000):
        pool: list[int | None] = [None, *rnd.sample(range(64), rnd.randint(1, 30))]
        ranks = [rnd.choice(pool) for _ in range(rnd.randint(1, 120))]
        want = dict(zip(ranks, range(len(ranks)), strict=True))
        assert list(_last_index(ranks).items()) == list(want.items()), ranks


def test_rank_runs_read_by_one_split_equal_the_carrier_by_carrier_reading() -> None:
    """The batch scan reports each kind of rank carrier once; the line ranks are then read
    by one regex split and a search for tokens past the runs (_run_ranks). Same MatchBatch
    as the carrier-by-carrier reading (the reading before the split existed) and as the
    exact path: on one launcher's batches with lookalikes in the text, and on adversarial
    ones (stacked and mixed prefixes, lines holding newlines, merged output)."""
    split, carried, exact = Matcher(RS), Matcher(RS), Matcher(RS)
    if not split._fast:  # noqa: SLF001 - re2 engine: there is only the exact path
        return
    carried._run_ranks = lambda *_: None  # type: ignore[method-assign]  # noqa: SLF001
    exact._fast = False  # noqa: SLF001
    real = split._run_ranks  # noqa: SLF001
    read: list[bool] = []

    def counting(*args: object) -> object:
        got = real(*args)  # type: ignore[arg-type]
        read.append(got is not None)
        return got

    split._run_ranks = counting  # type: ignore[method-assign]  # noqa: SLF001
    # (tokens in the text, and one behind a timestamp prefix: lines read alone; a merged
    # line: the exact path)
    lookalikes = ["[log_dist] [Rank 0] time (ms)", "step 12: ok", "[W x] [1,2]<stdout>: y",
                  "[2025-04-09 17:15:22] [rank3]: x", *["Step 7/100 | loss 1"] * 4]
    merged = "x[rank1]:Step 7/100 | loss 1"
    rnd = random.Random(18)
    for k in range(700):
        if k % 2:
            prefix = rnd.choice(list(LAUNCHERS.values()))
            texts = [prefix(i) + rnd.choice(QUIET * 8 + lookalikes + LOUD * (k % 7 == 0))
                     for i in range(rnd.randint(1, 80))]
            if k % 6 == 1:
                texts[rnd.randrange(len(texts))] = merged
        else:
            texts = _batch(rnd, 3, k % 10 == 0)
        lines = [Line(rnd.choice(["stdout", "stderr"]), i, float(i), t)
                 for i, t in enumerate(texts)]
        d = rnd.choice([None, 0, 3])
        got = split.match_lines(lines, default_rank=d)
        assert got == carried.match_lines(lines, default_rank=d), texts
        assert got == exact.match_lines(lines, default_rank=d), texts
    # both ways out of the split were taken (seeded)
    assert sum(read) > 50 and read.count(False) > 50, (sum(read), read.count(False))


def test_one_kind_of_carrier_is_read_without_a_call_per_line() -> None:
    """A batch where every line carries one launcher's rank prefix costs no Python call per
    line: the scan reports its markers once each (not a callback per prefixed line), and
    the ranks come from the split (srun labels: carrier by carrier, by choice)."""
    m = Matcher(RS)
    if not m._fast:  # noqa: SLF001 - re2 engine: there is only the exact path
        return
    for name in ("torch [rankN]:", "srun -l", "DeepSpeed", "mpirun --tag-output",
                 "torchrun --tee"):
        prefix = LAUNCHERS[name]
        texts = [prefix(i) + QUIET[i % len(QUIET)] for i in range(400)]
        hits = m._scan_e_own("\n".join(texts).encode())  # noqa: SLF001
        assert 1 <= len(hits) <= 2, (name, len(hits))
        lines = [Line("stdout", i, float(i), t) for i, t in enumerate(texts)]
        m._carrier_scan = None  # noqa: SLF001
        got = m.match_lines(lines, default_rank=None)
        # the per-carrier scan never ran (srun labels are read carrier by carrier by the
        # pure-Python reading, split=False; the native one reads them as the other kinds)
        assert (m._carrier_scan is None) == (  # noqa: SLF001
            name != "srun -l" or m._native is not None), name  # noqa: SLF001
        assert got.ranks == tuple(normalise_line(t).rank for t in texts), name
