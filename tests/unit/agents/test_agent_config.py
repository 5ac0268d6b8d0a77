"""AgentConfig from flags and env: torchrun rank mode, defaults, errors."""

from __future__ import annotations

from pathlib import Path

import pytest

from faultwatch.agents.agent import AgentConfig, rank_from_env
from faultwatch.errors import ConfigError

TORCHRUN_ENV = {"RANK": "5", "LOCAL_RANK": "1", "WORLD_SIZE": "8", "LOCAL_WORLD_SIZE": "4",
                "GROUP_RANK": "1", "FAULTWATCH_BOOTSTRAP": "k:9092",
                "FAULTWATCH_TOPIC_PREFIX": "x.", "FAULTWATCH_SPOOL_DIR": "/tmp/sp"}


def test_rank_from_env() -> None:
    assert rank_from_env(TORCHRUN_ENV) == (5, 8)
    assert rank_from_env({}) == (None, None)
    with pytest.raises(ConfigError, match="RANK"):
        rank_from_env({"RANK": "x"})


def test_from_env_defaults_in_rank_mode() -> None:
    cfg = AgentConfig.from_env_defaults(env=TORCHRUN_ENV, job="j/1", node="n1", cmd=["a"])
    assert (cfg.bootstrap, cfg.topic_prefix, cfg.topic) == ("k:9092", "x.", "x.logs")
    assert (cfg.rank, cfg.world_size, cfg.nnodes, cfg.local_ranks) == (5, 8, 2, (1,))
    assert cfg.cmd == ("a",)
    assert cfg.spool_path == Path("/tmp/sp/j%2F1/n1/rank5")  # injective, one component


def test_flags_win_over_env_and_bootstrap_required() -> None:
    cfg = AgentConfig.from_env_defaults(env=TORCHRUN_ENV, bootstrap="b:1", job="j", node="n",
                                        cmd=("a",), rank=0, topic_prefix="p.")
    assert (cfg.bootstrap, cfg.rank, cfg.topic_prefix) == ("b:1", 0, "p.")
    with pytest.raises(ConfigError, match="bootstrap"):
        AgentConfig.from_env_defaults(env={}, job="j", cmd=("a",))
    plain = AgentConfig.from_env_defaults(env={"FAULTWATCH_BOOTSTRAP": "k:1"}, job="j",
                                          node="n", cmd=("a",), spool_dir="/s")
    assert plain.rank is None and plain.spool_path == Path("/s/j/n/agent")


def test_linger_ms_has_a_documented_default_and_is_validated() -> None:
    from faultwatch.agents.config import LINGER_MS
    from faultwatch.cli.tree import parse_args

    base = {"env": {"FAULTWATCH_BOOTSTRAP": "k:1"}, "job": "j", "node": "n", "cmd": ("a",)}
    assert AgentConfig.from_env_defaults(**base).linger_ms == LINGER_MS == 100
    assert AgentConfig.from_env_defaults(**base, linger_ms=500).linger_ms == 500
    for bad in (0, -5, 10_001, 2.5, True):
        with pytest.raises(ConfigError, match="linger_ms"):
            AgentConfig.from_env_defaults(**base, linger_ms=bad)
    args = parse_args(["agent", "--job", "j", "--linger-ms", "250", "--", "x"])
    assert args.linger_ms == 250
    doc = (Path(__file__).resolve().parents[3] / "docs" / "agent.md").read_text()
    assert f"`--linger-ms` (default {LINGER_MS}" in doc
