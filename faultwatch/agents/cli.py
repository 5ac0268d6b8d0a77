"""The `faultwatch agent` flags turned into an AgentConfig (the parser is in faultwatch/cli.py)."""

from __future__ import annotations

import argparse
import os
from pathlib import Path
from typing import Any

from faultwatch.agents.config import AgentConfig
from faultwatch.errors import ConfigError


def _env_flag(name: str) -> bool:
    return os.environ.get(name, "").strip().lower() in ("1", "true", "yes", "on")


def _follow_decisions(args: argparse.Namespace) -> bool:
    """Node mode acts on decisions by default; rank mode (one agent per rank) does not."""
    if args.follow_decisions is not None:
        return bool(args.follow_decisions)
    if os.environ.get("FAULTWATCH_FOLLOW_DECISIONS", "").strip():
        return _env_flag("FAULTWATCH_FOLLOW_DECISIONS")
    rank_mode = args.rank is not None or "RANK" in os.environ
    return not rank_mode


def _attempt(args: argparse.Namespace) -> int:
    if args.attempt is not None:
        return int(args.attempt)
    v = os.environ.get("FAULTWATCH_ATTEMPT", "").strip()
    try:
        return int(v) if v else 0
    except ValueError:
        raise ConfigError("FAULTWATCH_ATTEMPT", f"not an integer: {v!r}") from None


def bootcheck_kw(args: argparse.Namespace) -> dict[str, Any]:
    return dict(bootcheck_paths=tuple(args.bootcheck_path),
                bootcheck_min_mb_s=args.bootcheck_min_mb_s,
                bootcheck_expect_gpus=args.bootcheck_expect_gpus,
                bootcheck_allreduce=args.bootcheck_allreduce,
                bootcheck_timeout_s=args.bootcheck_timeout_s)


def config_from_args(args: argparse.Namespace) -> AgentConfig:
    """The agent's configuration from the parsed flags; `args.cmd` is the command after --."""
    cmd = list(args.cmd)
    if not cmd and not args.flush:
        raise ConfigError("cmd", "no command given: faultwatch agent --job J -- CMD [ARGS...]")
    if not args.job:
        raise ConfigError("job", "--job is required (or $FAULTWATCH_JOB)")
    return AgentConfig.from_env_defaults(
        bootstrap=args.bootstrap, job=args.job, node=args.node, cmd=tuple(cmd),
        topic_prefix=args.topic_prefix, attempt=_attempt(args), heartbeat_s=args.heartbeat_s,
        heartbeat_flowing_s=args.heartbeat_flowing_s,
        spool_dir=args.spool_dir, rank=args.rank, nnodes=args.nnodes,
        term_grace_s=args.term_grace_s, exit_flush_timeout_s=args.exit_flush_timeout_s,
        max_line_bytes=args.max_line_bytes, spool_cap_bytes=args.spool_cap_mb << 20,
        follow_decisions=_follow_decisions(args), decision_wait_s=args.decision_wait_s,
        sdk=args.sdk, wait_for_nodes=args.wait_for_nodes,
        wait_for_nodes_timeout_s=args.wait_for_nodes_timeout_s, bootcheck=args.bootcheck,
        bootcheck_abort=args.bootcheck_abort, run_id=getattr(args, "run_id", None),
        labels=tuple(getattr(args, "label", None) or ()),
        metrics_port=getattr(args, "metrics_port", None),
        verdict_out=_path(getattr(args, "verdict_out", None)),
        decisions_out=_path(getattr(args, "decisions_out", None)),
        on_restart=getattr(args, "on_restart", None) or "relaunch",
        node_key_file=getattr(args, "node_key_file", None),
        metrics_address=getattr(args, "metrics_address", None) or "127.0.0.1",
        **bootcheck_kw(args))


def _path(v: str | None) -> Path | None:
    return Path(v) if v else None
