"""Matcher: rank prefixes, traceback grouping, progress, exits, torchrun summary, classify."""

from __future__ import annotations

import pytest

from faultwatch.core.events import Line, Match
from faultwatch.rules import (
    Matcher,
    classify,
    load_ruleset,
    parse_child_failed,
    pick_root,
    split_prefixed,
)
from tests.support.rules import builtin_ruleset

RS = builtin_ruleset()
M = Matcher(RS)


def mk(texts: list[str]) -> list[Line]:
    return [Line("stderr", i, float(i), t) for i, t in enumerate(texts)]


def test_prefix_split_merged() -> None:
    assert split_prefixed("[rank0]:foo[rank1]:Traceback x", None) == [
        (0, "foo"), (1, "Traceback x")]
    assert split_prefixed("[default3]:[rank3]:x", None) == [(3, "x")]
    assert split_prefixed("[trainer12]:y", None) == [(12, "y")]


def test_ranks_and_last_ts() -> None:
    b = M.match_lines(mk(["plain", "[rank1]:a", "[default2]:b", "[rank0]:x[rank1]:c", "z"]),
                      default_rank=7)
    assert b.ranks == (7, 1, 2, 0, 7)
    assert b.rank_last_ts == {7: 4.0, 1: 3.0, 2: 2.0, 0: 3.0}


def test_chained_traceback_one_match() -> None:
    tb = ["[rank1]:Traceback (most recent call last):",
          '[rank1]:  File "a.py", line 1, in <module>',
          "[rank0]:iteration 5/ 10 |",
          "[rank1]:    foo()",
          "[rank1]:    ^^^^^",
          "[rank1]:ConnectionResetError: [Errno 104] Connection reset by peer",
          "[rank1]:",
          "[rank1]:The above exception was the direct cause of the following exception:",
          "[rank1]:",
          "[rank1]:Traceback (most recent call last):",
          '[rank1]:  File "a.py", line 3, in <module>',
          "[rank1]:torch.distributed.DistStoreError: Socket Timeout"]
    b = M.match_lines(mk(tb))
    assert len(b.matches) == 1
    m = b.matches[0]
    assert m.rule == "torch-store-socket-timeout" and m.rank == 1 and m.seq == 11
    assert m.line == "torch.distributed.DistStoreError: Socket Timeout"
    assert m.context[0].startswith("Traceback") and len(m.context) == 11


def test_exception_group_and_cpp_terminate() -> None:
    lines = ["  + Exception Group Traceback (most recent call last):",
             '  |   File "x.py", line 1, in <module>',
             "  | ExceptionGroup: eg (2 sub-exceptions)",
             "  +-+---------------- 1 ----------------",
             "    | KeyError: 'LOCAL_RANK'",
             "    +------------------------------------",
             "terminate called after throwing an instance of 'c10::Error'",
             "  what():  CUDA error: uncorrectable ECC error encountered",
             "Exception raised from c10_cuda_check_implementation at x.cpp:43",
             "frame #0: c10::Error::Error() + 0x1"]
    b = M.match_lines(mk(lines))
    assert [m.rule for m in b.matches] == ["cuda-ecc-uncorrectable"]
    assert b.matches[0].line.startswith("  what():")
    assert len(b.matches[0].context) == 4


def test_progress_last_per_rank_and_stages() -> None:
    lines = [f" iteration {i:8d}/  500000 | lm loss: 2.0 |" for i in range(1, 40)]
    lines += ["[rank1]:Step 7/100 | loss 1", "saving checkpoint at iteration 39 to /c"]
    b = M.match_lines(mk(lines), default_rank=0)
    assert {(p.rank, p.step, p.total) for p in b.progress} == {(0, 39, 500000), (1, 7, 100)}
    assert [(s.stage, s.opens, s.hang_window_s) for s in b.stages] == [
        ("checkpoint", True, 3600.0)]


def test_progress_marks_read_step_total_and_rule_of_each_ranks_last_line() -> None:
    """_mark reads the extractor's groups by number: the step, the total (None when the
    line has none) and the rule, as on the fast path (prefixed lines) and the exact one."""
    lines = ["[rank0]: step 5/100 | x", "[rank2]: step=300, skipped=0, lr=[0.1]",
             "[rank3]: global_step: 42 loss: 1.5", "[rank1]:  45%|####5 | 450/1000 [01:23<01:40]",
             "[rank0]: step 6/100 | x"]
    want = {(0, 6, 100, "progress-step"), (2, 300, None, "progress-step"),
            (3, 42, None, "progress-global-step"), (1, 450, 1000, "progress-tqdm")}
    oom = "[rank4]: torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB"
    for texts in (lines, [*lines, oom]):  # (a rule hit: the exact path)
        b = M.match_lines(mk(texts))
        assert {(p.rank, p.step, p.total, p.rule) for p in b.progress} == want
        assert [p.ts for p in b.progress if p.rank == 0] == [4.0]
        assert [m.rule for m in b.matches] == ([] if texts is lines else ["cuda-oom"])


def test_match_exit() -> None:
    m = M.match_exit(137, None, 5.0)
    assert m is not None and m.rule == "exit-sigkill" and m.stream == "exit"
    m = M.match_exit(-15, None, 5.0)
    assert m is not None and m.category == "retryable"
    assert M.match_exit(1, None, 5.0) is None


def test_parse_child_failed() -> None:
    text = """torch.distributed.elastic.multiprocessing.errors.ChildFailedError:
============================================================
train.py FAILED
------------------------------------------------------------
Failures:
[1]:
  time      : 2024-01-01_00:00:01
  host      : node2
  rank      : 1 (local_rank: 1)
  exitcode  : 1 (pid: 124)
  error_file: <N/A>
  traceback : To enable traceback see: https://pytorch.org/docs/stable/elastic/errors.html
------------------------------------------------------------
Root Cause (first observed failure):
[0]:
  time      : 2024-01-01_00:00:00
  host      : node1
  rank      : 0 (local_rank: 0)
  exitcode  : -9 (pid: 123)
  error_file: <N/A>
  traceback : Signal 9 (SIGKILL) received by PID 123
============================================================"""
    fs = parse_child_failed(text.splitlines())
    assert [(f.rank, f.local_rank, f.exit_code, f.signal, f.host, f.root_cause) for f in fs] == [
        (1, 1, 1, None, "node2", False), (0, 0, -9, 9, "node1", True)]
    b = M.match_lines(mk(text.splitlines()))
    assert b.matches[0].rule == "torch-child-failed" and b.matches[0].cascade
    assert classify(RS, text)["rule"] == "exit-sigkill"


def test_pick_root() -> None:
    def m(ts: float, cascade: bool, seq: int = 0) -> Match:
        return Match("r", "retryable", cascade, ts, "x", seq=seq)
    assert pick_root([]) is None
    assert pick_root([m(1, True), m(3, False, 2), m(3, False, 1)]) == m(3, False, 1)
    assert pick_root([m(2, True), m(1, True)]) == m(1, True)


def test_pick_root_puts_hardware_first_and_notices_last() -> None:
    ret = Match("gloo", "retryable", False, 1.0, "a", seq=1)
    hw = Match("ecc", "hardware", False, 5.0, "b", seq=9)
    hw_cascade = Match("ib-peer", "hardware", True, 0.5, "c", seq=0)
    notice = Match("nan", "fatal", False, 0.1, "d", seq=0, action="notify")
    assert pick_root([ret, hw]) is hw  # a later hardware match beats an earlier retryable
    assert pick_root([ret, hw_cascade]) is ret  # a hardware *cascade* does not
    assert pick_root([notice, ret]) is ret  # an earlier notice never hides an error
    assert pick_root([notice, hw_cascade]) is notice  # the only root candidate left
    assert pick_root([notice]) is notice


def test_nccls_last_error_detail_names_the_bad_gpu() -> None:
    """torch's NCCL errors end with "Last error:" and NCCL's own detail (ncclGetLastError);
    the summary line before it says only "unhandled cuda error"."""
    text = "\n".join([
        "torch.distributed.DistBackendError: NCCL error in: ../torch/csrc/distributed/c10d/"
        "ProcessGroupNCCL.cpp:1970, unhandled cuda error (run with NCCL_DEBUG=INFO for "
        "details), NCCL version 2.19.3",
        "ncclUnhandledCudaError: Call to CUDA function failed.",
        "Last error:",
        "Cuda failure 'uncorrectable ECC error encountered'"])
    out = classify(RS, text)
    assert (out["category"], out["action"]) == ("hardware", "blacklist"), out


def test_classify_shape() -> None:
    out = classify(RS, "hello\n[rank2]:RuntimeError: CUDA error: an illegal memory access "
                       "was encountered\nWatchdog caught collective operation timeout")
    assert set(out) == {"category", "rule", "action", "line", "why"}
    assert out["category"] == "retryable" and out["action"] == "restart"
    ex = classify(RS, "nothing\n", 143, explain=True)
    assert ex["rule"] == "exit-sigterm" and ex["matches"] == []
    ex = classify(RS, "a\nNCCL WARN NET/IB : Got async event : port error", explain=True)
    assert ex["category"] == "hardware" and ex["action"] == "blacklist"
    assert ex["matches"] == [{"rule": "ib-async-fatal-event", "category": "hardware",
                              "cascade": False, "rank": None, "lineno": 2,
                              "line": "NCCL WARN NET/IB : Got async event : port error"}]
    assert classify(RS, "all fine", 0) == {"category": "unknown", "rule": None,
                                           "action": None, "line": None, "why": None}


def test_classify_answers_what_the_pipeline_does_with_a_failure() -> None:
    """A failure no rule explains is failed by the default policy (exit_code_and_error_msg),
    not `action: null`; budgets and the policy change the rule's action as the job stage
    does (issue 36 item 7)."""
    from faultwatch.core.policy import Policy

    out = classify(RS, "all fine", 1)
    assert (out["category"], out["action"]) == ("unknown", "fail"), out
    assert classify(RS, "all fine")["action"] == "fail"  # a failure log without its code
    assert classify(RS, "torch.OutOfMemoryError: CUDA out of memory.", 1)["action"] == "fail"
    assert classify(RS, "all fine", 1, policy=Policy(fault_tolerant_policy="on_failure")
                    )["action"] == "restart"
    no_budget = classify(RS, "ConnectionError: [Errno 104] Connection reset by peer", 1,
                         policy=Policy(max_restarts=0))
    assert no_budget["action"] == "fail" and "budget exhausted (0/0)" in str(no_budget["why"])
    mine = classify(RS, "my flaky thing\n", 1, policy=Policy(retryable_errors=("flaky",)))
    assert (mine["category"], mine["action"]) == ("retryable", "restart")
    assert mine["why"] == "retryable by pattern 'flaky'"


def test_policy_retryable_errors(tmp_path) -> None:  # type: ignore[no-untyped-def]
    p = tmp_path / "p.yaml"
    p.write_text("version: 1\npolicy:\n  retryable_errors: ['flaky storage hiccup']\n")
    assert classify(load_ruleset([p]), "x\nflaky storage hiccup\n")["category"] == "retryable"


def test_re2_fallback_same_as_hyperscan() -> None:
    # hyperscan has wheels for x86_64 only (pyproject installs it there); on aarch64 the
    # re2 engine is the only one and there is nothing to compare it with.
    pytest.importorskip("hyperscan", reason="hyperscan wheels exist for x86_64 only")
    re2m = Matcher(RS, engine="re2")
    assert re2m.engine == "re2" and M.engine == "hyperscan"
    sample = ["ok", "[rank3]:RuntimeError: Socket Timeout", "iteration 3/ 9 |",
              "NVRM: Xid (PCI:0000:3b:00): 79, pid=1, GPU has fallen off the bus.",
              "ünïcode KeyError: 'x'", "KeyError: 'LOCAL_RANK'", "Loss is nan, stopping",
              "saving checkpoint", "Traceback (most recent call last):", "ValueError: bad"]
    a, b = M.match_lines(mk(sample)), re2m.match_lines(mk(sample))
    assert a == b and len(a.matches) >= 5
