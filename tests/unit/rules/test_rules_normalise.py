"""The line-prefix normaliser: what it strips, what it learns, and that rules see through it."""

from __future__ import annotations

import pytest

from faultwatch.core.events import STDERR, Line
from faultwatch.rules import Matcher, classify
from faultwatch.rules.normalise import has_other_prefix, normalise_line
from tests.support.rules import builtin_ruleset

RS = builtin_ruleset()
MATCHER = Matcher(RS)


@pytest.mark.parametrize(("line", "text", "rank", "node", "kinds"), [
    ("[stderr]ModuleNotFoundError: x", "ModuleNotFoundError: x", None, None, ("stream",)),
    ("[stdout] [2025-04-09 17:15:22] [worker-1] hello", "hello", None, "worker-1",
     ("stream", "timestamp", "worker")),
    ("2025-04-09T17:15:22.123456789Z RuntimeError: x", "RuntimeError: x", None, None,
     ("rfc3339",)),
    ("2025-04-09T17:15:22+00:00 hi", "hi", None, None, ("rfc3339",)),
    ("0: Traceback (most recent call last):", "Traceback (most recent call last):", 0, None,
     ("srun_label",)),
    ("  12: x", "x", 12, None, ("srun_label",)),
    ("(RayTrainWorker pid=123, ip=10.0.0.5) RuntimeError: y", "RuntimeError: y", None,
     "10.0.0.5", ("ray_worker",)),
    ("(pid=77) z", "z", None, None, ("ray_worker",)),
    ("(raylet, ip=10.1.2.3) [2025-01-01 00:00:00,000 E 1 1] w", "[2025-01-01 00:00:00,000 E 1 1] w",
     None, "10.1.2.3", ("ray_daemon",)),
    ("[rank3]: boom", "boom", 3, None, ("rank",)),
    ("[default0]:[rank5]:boom", "boom", 5, None, ("rank", "rank")),
    ("[Rank 2] boom", "boom", 2, None, ("rank_word",)),
    ("[1,3]<stderr>:Traceback", "Traceback", 3, None, ("mpi_tag",)),
    ("Apr  9 17:15:22 gpu-node-7 kernel: NVRM: Xid (PCI:0000:3b:00): 79, pid=1",
     "NVRM: Xid (PCI:0000:3b:00): 79, pid=1", None, "gpu-node-7", ("syslog",)),
    ("[12345.678901] NVRM: GPU has fallen off the bus.", "NVRM: GPU has fallen off the bus.",
     None, None, ("dmesg",)),
    ("[    5.000001] x", "x", None, None, ("dmesg",)),
    ("kernel: mlx5_core 0000:5e:00.0: Port module event", "mlx5_core 0000:5e:00.0: Port "
     "module event", None, None, ("kernel",)),
    ("[pod/trainer-0/pytorch] x", "x", None, "trainer-0", ("pod",)),
    ("trainer-1  | x", "x", None, "trainer-1", ("compose",)),
])
def test_prefixes_stripped_and_learned(line: str, text: str, rank: int | None,
                                       node: str | None, kinds: tuple[str, ...]) -> None:
    n = normalise_line(line)
    assert (n.text, n.rank, n.node, n.kinds) == (text, rank, node, kinds)
    assert n.stripped + n.text == line


@pytest.mark.parametrize("line", [
    "RuntimeError: x", "[INFO] x", "[W socket.cpp:1] x", "iteration 5/10", "  File \"a.py\"",
    "2025-04-09 is a date", "(foo) bar", "[2024-01-01] date only", "12:30 lunch",
    "    | ValueError: in a group box",
])
def test_ordinary_lines_untouched(line: str) -> None:
    n = normalise_line(line, default_rank=7)
    assert (n.text, n.rank, n.stripped) == (line, 7, "")


def test_has_other_prefix() -> None:
    assert has_other_prefix("a\n[stderr]x")
    assert not has_other_prefix("a\n[rank1]: x\nb")


@pytest.mark.parametrize("prefix", [
    "", "[stderr]", "[stdout] [2025-04-09 17:15:22] [worker-1] ", "2025-04-09T17:15:22Z ",
    "0: ", "(RayTrainWorker pid=9, ip=10.0.0.1) ", "[rank1]: ", "[Rank 1] ",
    "Apr  9 17:15:22 n1 python3[42]: ", "[default0]:[rank1]:",
])
def test_traceback_seen_through_prefixes(prefix: str) -> None:
    log = "\n".join(prefix + t for t in [
        "Traceback (most recent call last):", '  File "train.py", line 3, in <module>',
        "    import tensorboard", "ModuleNotFoundError: No module named 'tensorboard'"])
    res = classify(RS, log, explain=True)
    assert res["category"] == "fatal" and res["rule"] == "python-import-error"
    assert res["line"] == "ModuleNotFoundError: No module named 'tensorboard'"
    assert bool(res["prefixes"]) == bool(prefix)


def test_rank_from_srun_label_reaches_the_match() -> None:
    lines = [Line(STDERR, i, float(i), t) for i, t in enumerate(
        ["1: hello", "3: RuntimeError: CUDA out of memory. Tried to allocate 2 GiB"])]
    batch = MATCHER.match_lines(lines)
    assert batch.ranks == (1, 3)
    assert [(m.rank, m.line) for m in batch.matches] == [
        (3, "RuntimeError: CUDA out of memory. Tried to allocate 2 GiB")]


def test_anchored_rule_sees_through_prefix() -> None:
    anchored = [r for r in RS.rules for x in r.regex if x.startswith("^")]
    assert anchored, "the built-in set has anchored rules to exercise"
    for r in anchored:
        for t in r.tests:
            if not t.expect_match:
                continue
            plain = {x.id for x, _ in MATCHER.rules_matching(t.text)}
            for prefix in ("[stderr]", "2025-04-09T17:15:22Z ", "4: "):
                got = {x.id for x, _ in MATCHER.rules_matching(prefix + t.text)}
                assert r.id in got and got == plain, (prefix, t.text)
                lines = [Line(STDERR, 0, 0.0, prefix + t.text)]
                plain_b = MATCHER.match_lines([Line(STDERR, 0, 0.0, t.text)])
                assert [m.rule for m in MATCHER.match_lines(lines).matches] == \
                    [m.rule for m in plain_b.matches]


@pytest.mark.parametrize("lines", [
    ["[ 5123.000001] NVRM: GPU at PCI:0000:3b:00: GPU-1a2b has fallen",
     "[ 5123.000002] NVRM: off the bus."],
    ["Apr  9 17:15:22 gpu-7 kernel: NVRM: GPU 0000:3b:00.0: GPU-1a2b has",
     "Apr  9 17:15:22 gpu-7 kernel: NVRM: fallen off the bus."],
])
def test_nvrm_message_split_over_two_lines(lines: list[str]) -> None:
    res = classify(RS, "\n".join(["step 5 ok", *lines]))
    assert (res["category"], res["rule"]) == ("hardware", "nvidia-fallen-off-bus")
    if lines[0].endswith("fallen"):  # the first half alone already says it
        assert classify(RS, lines[0] + "\nstep 6 ok")["category"] == "hardware"


def test_nccl_cuda_failure_802_through_prefix() -> None:
    line = "0: host:12:12 [0] NCCL WARN Cuda failure 802 'system not yet initialized'"
    res = classify(RS, "\n".join(["0: NCCL INFO Bootstrap : Using eth0", line]))
    assert (res["category"], res["rule"]) == ("hardware", "cuda-system-not-ready")


def test_normalise_batch_equals_line_by_line() -> None:
    import random

    from faultwatch.rules.normalise import normalise_batch
    pre = ["", "[stderr]", "[2025-04-09 17:15:22] ", "2025-04-09T17:15:22Z ", "3: ",
           "[Rank 2] ", "(RayTrainWorker pid=12, ip=10.0.0.1) ", "[12345.678901] ",
           "[worker-1] ", "[rank1]:", "[default0]:[rank5]:", "[1,4]<stdout>:",
           "Apr  9 17:15:22 n1 kernel: ", "x "]
    body = ["hello", "RuntimeError: boom", "  File \"a.py\", line 1", "", "12 items"]
    rnd = random.Random(5)
    used = 0
    for _ in range(3000):
        n = rnd.randint(1, 12)
        texts = ["".join(rnd.choice(pre) for _ in range(rnd.randint(0, 3))) + rnd.choice(body)
                 for _ in range(n)]
        d = rnd.choice([None, 0, 7])
        got = normalise_batch("\n".join(texts), n, d)
        if got is None:
            continue
        used += 1
        want = [normalise_line(t, d) for t in texts]
        assert got == ("\n".join(w.text for w in want), [w.rank for w in want]), texts
    assert used > 1000
