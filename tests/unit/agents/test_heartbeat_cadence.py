"""The agent's heartbeat cadence: every quiet interval, else every heartbeat_flowing_s."""

from __future__ import annotations

from pathlib import Path

from faultwatch.agents.agent import LINES_LOST_HOLD_S, heartbeat_due
from faultwatch.agents.config import AgentConfig
from faultwatch.core.policy import Policy


def test_a_quiet_interval_always_sends_a_heartbeat() -> None:
    assert heartbeat_due(False, 0.0, 10.0)  # silence must be proven at the usual cadence


def test_while_the_child_prints_heartbeats_wait_for_the_flowing_interval() -> None:
    assert not heartbeat_due(True, 2.0, 10.0)
    assert not heartbeat_due(True, 9.9, 10.0)
    assert heartbeat_due(True, 10.0, 10.0)  # progress stall / exit hang still evaluated
    assert heartbeat_due(True, 2.0, 0.0)  # 0: every interval (the cadence before)


def test_the_default_flowing_interval_fits_the_default_node_lost_window() -> None:
    cfg = AgentConfig(bootstrap="", job="j", node="n", cmd=("true",), spool_dir=Path("/tmp"))
    # a flowing node's heartbeats must not lag more
    # than half of it behind a quiet node's, or the hang check treats them as stale
    assert cfg.heartbeat_flowing_s + cfg.heartbeat_s < Policy().node_lost_s / 2


def test_dropped_lines_prove_nothing_so_heartbeats_keep_the_quiet_cadence() -> None:
    # a full spool disk drops the printed lines: the processor sees only heartbeats
    assert heartbeat_due(True, 2.0, 10.0, since_lines_lost_s=1.0)
    assert heartbeat_due(True, 2.0, 10.0, since_lines_lost_s=LINES_LOST_HOLD_S - 0.1)
    assert not heartbeat_due(True, 2.0, 10.0, since_lines_lost_s=LINES_LOST_HOLD_S)
