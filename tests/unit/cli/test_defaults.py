"""Defaults are declared once: a flag's default is read from the library code that uses it
(cli/options.default_of), and the name rule, the duration grammar and the quarantine
backoff each have one owner that every caller shares."""

from __future__ import annotations

import argparse
import ast
from pathlib import Path

import pytest

from faultwatch.actuate.limits import ActuateLimits
from faultwatch.agents.config import AgentConfig, check_name
from faultwatch.agents.identity import check_id
from faultwatch.cli.nodes import parse_duration_s
from faultwatch.cli.tree import build_parser, parse_args
from faultwatch.core import decide
from faultwatch.core.names import name_problem
from faultwatch.core.pmap import PMap
from faultwatch.core.policy import Policy
from faultwatch.core.registry import RegistryPolicy, quarantine_duration_s
from faultwatch.errors import ConfigError, DecodeError
from faultwatch.notify.grouping import GroupingPolicy
from faultwatch.notify.limit import RateLimits, RetryPolicy
from faultwatch.readers.select import parse_when, span_s
from faultwatch.wire import safe_name

CLI = Path(__file__).resolve().parents[3] / "faultwatch" / "cli"
# numeric flag defaults written in cli/ that no library dataclass holds (flag: why)
OWN_DEFAULTS = {
    "--port": "the local broker's port (kafka up)", "--timeout-s": "a command's Kafka timeout",
    "--interval-s": "status --watch refresh", "--poll-s": "agent tail's polling",
    "--stop-timeout-s": "process: the clean stop's bound", "--fleet-nodes": "0: the registry's",
    "--bootcheck-min-mb-s": "0: no floor", "--verbose": "a counter",
}


def _numeric_defaults(source: str) -> list[str]:
    """The flags of add_argument calls whose default is a number written in place."""
    out = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Call) and getattr(node.func, "attr", "") == "add_argument":
            for kw in node.keywords:
                consts = [c for c in ast.walk(kw.value) if isinstance(c, ast.Constant)]
                only_consts = all(isinstance(n, ast.Constant | ast.BinOp | ast.operator)
                                  for n in ast.walk(kw.value))
                if kw.arg == "default" and consts and only_consts \
                        and all(isinstance(c.value, int | float) and not isinstance(c.value, bool)
                                for c in consts):
                    flags = [a.value for a in node.args if isinstance(a, ast.Constant)]
                    out.append(next((f for f in flags if f.startswith("--")), str(flags)))
    return out


def test_no_flag_spells_a_library_default() -> None:
    found = [f for p in sorted(CLI.glob("*.py")) for f in _numeric_defaults(p.read_text())]
    assert found and sorted(set(found) - set(OWN_DEFAULTS)) == []


def test_the_scan_finds_a_planted_default() -> None:
    planted = 'p.add_argument("--max-posts-per-min", type=float, default=20.0)\n'
    assert _numeric_defaults(planted) == ["--max-posts-per-min"]


def _defaults(*argv: str) -> argparse.Namespace:
    return build_parser().parse_args(list(argv))


def test_the_flags_default_to_the_librarys_values() -> None:
    a = _defaults("actuate", "--backend", "exec")
    lim, reg = ActuateLimits(), RegistryPolicy()
    assert (a.max_drains_per_window, a.drain_window_s, a.max_drained_share, a.quarantine_s) \
        == (lim.max_drains_per_window, lim.window_s, lim.max_drained_share, reg.quarantine_s)
    assert reg.quarantine_s == Policy().blacklist_s  # one first quarantine
    n = _defaults("notify", "--webhook", "http://x")
    rl, gp, rp = RateLimits(), GroupingPolicy(), RetryPolicy()
    assert (n.max_posts_per_min, n.max_posts_per_min_total, n.digest_interval_s,
            n.min_post_gap_s) == (rl.per_webhook_per_min, rl.total_per_min,
                                  rl.digest_interval_s, rl.min_gap_s)
    assert (n.group_wait_s, n.group_interval_s, n.repeat_interval_s, n.resolve_timeout_s,
            tuple(n.group_by.split(","))) == (gp.group_wait_s, gp.group_interval_s,
                                              gp.repeat_interval_s, gp.resolve_timeout_s,
                                              gp.group_by)
    assert (n.retries, n.retry_base_s) == (rp.attempts, rp.base_s)
    g = parse_args(["agent", "--job", "j", "--", "true"])
    c = AgentConfig(bootstrap="b", job="j", node="n", cmd=("true",), spool_dir=Path("/tmp"))
    for name in ("heartbeat_s", "heartbeat_flowing_s", "exit_flush_timeout_s",
                 "term_grace_s", "decision_wait_s", "wait_for_nodes_timeout_s",
                 "max_line_bytes", "bootcheck_timeout_s"):
        assert getattr(g, name) == getattr(c, name), name


NAMES = ["ok-1", "x" * 256, "", "x" * 257, "a\nb", "a\x85b", "a\u202eb", "a\u2028b", "a\u200bb",
         "a\tb", "ñodo-7", "节点"]


@pytest.mark.parametrize("name", NAMES)
def test_one_name_rule_for_the_wire_the_agent_and_the_identity(name: str) -> None:
    bad = name_problem(name) is not None
    with_agent = with_id = with_wire = False
    try:
        check_name("node", name)
    except ConfigError:
        with_agent = True
    try:
        check_id("run_id", name)
    except ConfigError:
        with_id = True
    try:
        safe_name(name, "node")
    except DecodeError:
        with_wire = True
    assert bad == with_agent == with_id == with_wire, name
    assert bad == (name in ("", "x" * 257) or not name.isprintable()), name


def test_one_duration_grammar() -> None:
    for text, secs in (("90s", 90), ("30m", 1800), ("2h", 7200), ("1d", 86400),
                       ("1h30m", 5400), ("2H", 7200)):
        assert span_s(text) == secs
        assert parse_duration_s(text) == secs
        assert parse_when(text, 10_000.0) == 10_000.0 - secs
    assert parse_duration_s("90") == 90 and span_s("90") is None
    assert parse_when("90", 10_000.0) == 90.0  # a bare number is a time, not an age
    for bad in ("1x", "h", "-5m"):
        assert span_s(bad) is None
        with pytest.raises(ConfigError):
            parse_duration_s(bad)


def test_one_quarantine_backoff() -> None:
    """The job stage's blacklist terms and the registry's quarantines last the same."""
    p = Policy(blacklist_s=600.0)
    bl: PMap[str, tuple[int, float]] = PMap()
    for strikes in range(1, 12):
        bl, ev = decide.blacklist_terms(("n",), 0.0, p, bl)
        assert ev["n"]["duration_s"] == quarantine_duration_s(
            strikes, RegistryPolicy(quarantine_s=600.0)), strikes
