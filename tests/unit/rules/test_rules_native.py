"""The native fast path (native/src/lib.rs) gives exactly the exact path's results on
adversarial prefixes, the matcher stage's bytes are the same both ways, and the exact path
alone stays in use where the module is absent or turned off."""

from __future__ import annotations

import importlib.util
import os
import random
import shutil

import pytest

from faultwatch.core.events import Line
from faultwatch.core.policy import Policy
from faultwatch.rules import Matcher
from faultwatch.rules.native import NO_NATIVE_ENV, native_module
from faultwatch.rules.normalise import normalise_line
from faultwatch.streams.matcher_stage import MatcherStage
from faultwatch.streams.records import InRecord, LiveRules
from faultwatch.wire import encode_line_chunks, encode_lines
from tests.support.rules import builtin_ruleset

RS = builtin_ruleset()
NATIVE = native_module()
needs_native = pytest.mark.skipif(Matcher(RS).fast is None, reason="the native fast path is not "
                                  "built here (no cargo at install, FAULTWATCH_NO_NATIVE)")

# rank prefixes of every kind and their near misses (too many letters or digits, spaces,
# unicode digits, wide characters), stacked up to past MAX_STACK
PREFIXES = ["", "", "[rank3]:", "[rank1]: ", "[default0]:", "[rank12345678]:", "[rank1234567]:",
            "[" + "a" * 32 + "1]:", "[" + "a" * 33 + "1]:", "[_9]:", "[a]:", "[rank3]:  ",
            "[Rank 2] ", "[Rank 2]", "[Rank 12345678] ", "[rank 2] ", "[1,4]<stdout>:",
            "[1,4]<stderr>: ", "[1234567,4]<stdout>:", "[1,4]<stdin>:", "[1,12345678]<stdout>:",
            "3: ", " 12: ", "      7: ", "       7: ", "1234567: ", "123456: ", "3:", "3 : ",
            "2025-04-09T17:15:22.123456789Z ", "[2025-04-09 17:15:22] ", "[stderr]",
            "2025-04-09 17:15:22+05:30 ", "2025-04-09T17:15:22.1234567890Z ",
            "2025-04-09T17:15:22: ", "2025-04-09T17:15:22+05:3 ", "2025-04-09T17:15:22-0530 ",
            "[worker-1] ", "(pid=12) ", "x ", "[W x] ", "py:464: ", "[\u0663]: ", "\u0663: ",
            "[rank\u0663]:", "\u00e9[rank2]:", "\U0001f600 [Rank 1] "]
BODIES = ["iteration      5/  100 | lm loss: 2.0 |", "hello", "", "step 12: ok",
          "[log_dist] [Rank 0] time (ms)", "x[rank1]: merged", "[W x] [1,2]<stdout>: y",
          "\u00fc\u00f1\u00ee 3: \u00e7\u00f8d\u00e9", "\u6b65 7/100 [00", "a [b [rank4]: c",
          "[[rank2]:", "9: 8: 7: ", "\U0001f600 [1,2]<stdout>:x", "RuntimeError: CUDA out of "
          "memory.", "Traceback (most recent call last):", "a lone surrogate \udc80 step 3/9"]


def _texts(rnd: random.Random) -> list[str]:
    fixed = [rnd.choice(PREFIXES) for _ in range(rnd.randint(0, 3))]
    mixed = rnd.random() < 0.4
    out = []
    for _ in range(rnd.randint(1, 40)):
        pre = [rnd.choice(PREFIXES) for _ in range(rnd.randint(0, 10 if mixed else 3))] \
            if mixed else fixed
        out.append("".join(pre) + rnd.choice(BODIES))
    if rnd.random() < 0.05:  # a line holding a newline (both readings decline the batch)
        out[rnd.randrange(len(out))] = "held\n[rank5]:newline"
    return out


@needs_native
def test_native_ranks_equal_normalise_line() -> None:
    """Every batch the fast path takes has normalise_line's rank on every line (stacked runs
    past MAX_STACK, near misses, unicode digits, wide characters), and the same MatchBatch
    as the exact path; batches it declines are the exact path's alone."""
    fast, exact = Matcher(RS), Matcher(RS)
    exact.fast = None
    rnd = random.Random(21)
    taken = 0
    for _ in range(1500):
        texts = _texts(rnd)
        d = rnd.choice([None, 0, 3])
        got = fast.fast.scan(texts, [float(i) for i in range(len(texts))], d)
        lines = [Line("stdout", i, float(i), t) for i, t in enumerate(texts)]
        if got is not None:
            taken += 1
            assert got[1] == [normalise_line(t, d).rank for t in texts], texts
            assert got[0] == "\n".join(normalise_line(t).text for t in texts).encode(), texts
        assert fast.match_lines(lines, default_rank=d) == exact.match_lines(
            lines, default_rank=d), texts
    assert taken > 20, taken  # (seeded; most batches hold a rule hit or a merged line)


LAUNCHERS = [lambda i: f"{i % 12:>2}: ", lambda i: f"[default{i % 8}]:",
             lambda i: f"[rank{i % 8}]:", lambda i: f"{i % 3}: [default{i % 8}]:",
             lambda i: f"2025-04-09T17:15:{i % 60:02d}.{i:09d}Z ",
             lambda i: f"2025-04-09T17:15:{i % 60:02d}.{i:09d}Z {i % 4}: ",
             lambda i: f"[Rank {i % 8}] ", lambda i: f"[1,{i % 4}]<stdout>:", lambda i: ""]
QUIET = ["iteration      5/  100 | lm loss: 2.0 |", "step 12: ok", "{'loss': 1.2}",
         " 45%|####      | 45/100 [00:10<00:12,  4.5it/s]", "Step 7/100 | loss 1",
         "[log_dist] [Rank 0] time (ms)", "py:464: UserWarning: x", "\u00fc 3/4", ""]


@needs_native
def test_the_matcher_gives_the_same_batches_with_and_without_the_native_module() -> None:
    """Whole MatchBatches (ranks, each rank's last line, progress, hits) on launchers'
    batches and mixed ones are the same with the fast path and with the exact path alone
    (what runs when the module is absent)."""
    native, python = Matcher(RS), Matcher(RS, native=False)
    rnd = random.Random(22)
    for k in range(1500):
        if k % 2:
            prefix = rnd.choice(LAUNCHERS)
            texts = [prefix(i) + rnd.choice(QUIET + BODIES[:3] * (k % 5 == 1))
                     for i in range(rnd.randint(1, 80))]
        else:
            texts = _texts(rnd)
        lines = [Line("stdout", i, float(i), t) for i, t in enumerate(texts)]
        d = rnd.choice([None, 0, 3])
        got = native.match_lines(lines, default_rank=d)
        assert got == python.match_lines(lines, default_rank=d), texts


@needs_native
def test_the_matcher_stage_sends_the_same_bytes_both_ways() -> None:
    """The stage's signals records, byte for byte, with and without the native module, on
    both record forms (as bench/matcher_throughput.py --expect-digests checks at scale)."""
    rnd = random.Random(23)
    recs = []
    for k in range(60):
        prefix = LAUNCHERS[k % len(LAUNCHERS)]
        texts = [prefix(i) + rnd.choice(QUIET + ["RuntimeError: CUDA out of memory."] *
                                        (k % 7 == 0)) for i in range(200)]
        if k % 2:
            value = encode_line_chunks(f"job{k % 4}", 0, "n0", "run", [
                Line("stdout", j, float(j), "\n".join(texts[j:j + 50]))
                for j in range(0, 200, 50)])
        else:
            value = encode_lines(f"job{k % 4}", 0, "n0", "run", [
                Line("stdout", j, float(j), t) for j, t in enumerate(texts)])
        recs.append(InRecord("faultwatch.logs", 0, k, f"job{k % 4}/n0".encode(), value))

    def refuse(rec: InRecord, err: Exception) -> None:
        raise AssertionError(f"dead-lettered: {err!r}")

    outs = []
    for m in (Matcher(RS), Matcher(RS, native=False)):
        stage = MatcherStage(LiveRules(m, Policy(), "t"), refuse)
        outs.append([stage.process_batch(recs[i:i + 10], 2e9) for i in range(0, 60, 10)])
    assert outs[0] == outs[1]
    assert sum(len(o) for o in outs[0]) == 24  # a record per job and consumer batch


def test_the_native_module_is_off_with_the_environment_switch(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(NO_NATIVE_ENV, "1")
    assert native_module() is None
    assert Matcher(RS).fast is None
    monkeypatch.setenv(NO_NATIVE_ENV, "0")
    built = importlib.util.find_spec("faultwatch.rules._native") is not None
    assert (native_module() is not None) == built


@pytest.mark.skipif(not os.environ.get("CI") or os.environ.get(NO_NATIVE_ENV),
                    reason="CI's install builds it (a machine of the project's kind)")
def test_ci_builds_the_native_module() -> None:
    """`pip install .` on a fresh machine of this kind builds native/ (setup.py: optional,
    so an install without cargo goes on without it), and the built-in rules compile in it."""
    if shutil.which("cargo") is None:
        pytest.skip("no cargo")
    assert NATIVE is not None and Matcher(RS).fast is not None
