"""Loader and validation: errors with file:line, overrides, policy."""

from __future__ import annotations

from pathlib import Path

import pytest

from faultwatch.errors import RuleError
from faultwatch.rules import POLICY_KEYS, check_files, load_ruleset, run_rule_tests
from faultwatch.rules import validate as v


def write(tmp_path: Path, name: str, text: str) -> Path:
    p = tmp_path / name
    p.write_text(text)
    return p


def test_builtin_loads_and_passes_own_tests() -> None:
    rs = load_ruleset()
    assert len(rs.rules) > 50 and len(rs.version) == 12
    assert load_ruleset().version == rs.version
    assert run_rule_tests(rs) == []


def test_all_errors_at_once_with_lines(tmp_path: Path) -> None:
    p = write(tmp_path, "bad.yaml", """version: 1
rules:
  - id: a
    category: retryable
    contians: foo
  - id: a
    category: retryable
    contains: x
  - id: b
    category: weird
    regex: 'foo('
  - id: c
    category: fatal
    regex: '(a+)+'
""")
    probs = check_files([p], builtin=False)
    text = "\n".join(str(x) for x in probs)
    assert f"{p}:5: rule: unknown key 'contians' (did you mean 'contains'?)" in text
    assert f"{p}:6: duplicate rule id 'a'" in text
    assert f"{p}:10: category must be one of" in text
    assert f"{p}:11: invalid regex at column 5" in text
    assert f"{p}:14:" in text and "catastrophically" in text
    with pytest.raises(RuleError) as ei:
        load_ruleset([p], builtin=False)
    assert len(ei.value.problems) == len(probs) >= 5


def test_file_too_big(tmp_path: Path) -> None:
    p = write(tmp_path, "big.yaml", "version: 1\n#" + "x" * v.MAX_FILE_BYTES + "\n")
    assert "limit" in check_files([p], builtin=False)[0].message


@pytest.mark.parametrize("pat", [r"(a+)+", r"(.*)*", r"(\w+\s?)*"])
def test_catastrophic_rejected(pat: str) -> None:
    assert v.backtracking_error(pat)


@pytest.mark.parametrize("pat", [r"(?:\d+\.)+\d+", r"iteration\s+(?P<step>\d+)", r"(ab)+"])
def test_safe_patterns_accepted(pat: str) -> None:
    assert v.backtracking_error(pat) is None


def test_override_and_disable(tmp_path: Path) -> None:
    p = write(tmp_path, "user.yaml", """version: 1
rules:
  - id: nccl-watchdog-timeout
    disabled: true
  - id: cuda-oom
    override: replace
    category: retryable
    contains: CUDA out of memory
  - id: my-rule
    category: hardware
    contains: BOOM
    signals: [SIGKILL, 7]
policy:
  max_restarts: 5
  execution_mode: async
""")
    rs = load_ruleset([p])
    ids = {r.id for r in rs.rules}
    assert "nccl-watchdog-timeout" not in ids
    oom = rs.get("cuda-oom")
    assert oom is not None and oom.category == "retryable"
    my = rs.get("my-rule")
    assert my is not None and my.signals == (9, 7)
    assert rs.policy == {"max_restarts": 5, "execution_mode": "async"}
    assert rs.version != load_ruleset().version


def test_disable_unknown_rule(tmp_path: Path) -> None:
    p = write(tmp_path, "u.yaml", "version: 1\nrules:\n  - id: nccl-watchdog-timout\n"
              "    disabled: true\n")
    probs = check_files([p])
    assert probs and "did you mean 'nccl-watchdog-timeout'" in probs[0].message


def test_policy_validation(tmp_path: Path) -> None:
    p = write(tmp_path, "p.yaml", """version: 1
policy:
  max_restarts: -1
  hang_window_s: 0
  max_failure_rate: 1.5
  fault_tolerant_policy: sometimes
  enable_restart: "yes"
  hang_windw_s: 3
""")
    msgs = [x.message for x in check_files([p], builtin=False)]
    assert len(msgs) == 6
    assert any("did you mean 'hang_window_s'" in m for m in msgs)
    assert set(POLICY_KEYS) >= {"execution_mode", "max_same_error", "retryable_errors"}


def test_inline_test_failure_located(tmp_path: Path) -> None:
    p = write(tmp_path, "t.yaml", """version: 1
rules:
  - id: x
    category: fatal
    contains: BOOM
    tests:
      match:
        - "no boom here"
      no_match:
        - "BOOM"
  - id: steps
    kind: progress
    regex: 'it (?P<step>\\d+)'
    tests:
      match:
        - line: "it 12"
          step: 13
""")
    probs = run_rule_tests([p])
    assert [x.line for x in probs] == [8, 10, 16]


def test_source_cites_where_a_rule_comes_from(tmp_path: Path) -> None:
    """`source:` (a string or a list of strings) is kept on the rule; anything else is a
    problem at its line. Every built-in rule added with the vendor vocabulary cites one."""
    p = write(tmp_path, "src.yaml", """version: 1
rules:
  - id: one
    category: hardware
    contains: "x1"
    source: "Vendor guide, section 3"
  - id: two
    category: hardware
    contains: "x2"
    source: ["a.h: MSG_A", "b.c: msg_b"]
  - id: three
    category: hardware
    contains: "x3"
    source: {bad: 1}
""")
    probs = check_files([p], builtin=False)
    assert [(x.line, x.message) for x in probs] == [
        (14, "source must be a non-empty string or list of strings")]
    p.write_text(p.read_text().rsplit("  - id: three", 1)[0])
    rs = load_ruleset([p], builtin=False)
    one, two = rs.get("one"), rs.get("two")
    assert one is not None and one.source == ("Vendor guide, section 3",)
    assert two is not None and two.source == ("a.h: MSG_A", "b.c: msg_b")
    builtin = load_ruleset()
    for rid in ("nvidia-xid-restart-app", "nvidia-xid-reset-gpu", "nvidia-xid-reboot-node",
                "nvidia-xid-hardware", "nvidia-xid-ignore", "dcgm-health-failure",
                "cuda-init-failure", "k8s-node-lost", "cloud-maintenance-event",
                "cloud-instance-retirement", "cloud-spot-preemption", "slurm-node-failure"):
        r = builtin.get(rid)
        assert r is not None and r.source, rid
