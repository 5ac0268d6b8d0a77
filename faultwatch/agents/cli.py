"""The `faultwatch agent` subcommand: argument parsing only; the work is in agent.py."""

from __future__ import annotations

import argparse
import os
from typing import Any

from faultwatch.agents.agent import AgentConfig, main_sync
from faultwatch.errors import ConfigError


def register(subparsers: Any) -> argparse.ArgumentParser:
    """Add `agent` to the top-level CLI's subparsers."""
    p: argparse.ArgumentParser = subparsers.add_parser(
        "agent", help="run a command and ship its output, exit and heartbeats to Kafka",
        description="Run CMD, tee its stdout/stderr unchanged, and ship lines, heartbeats and "
                    "its exit to <prefix>logs. Unacked records wait in a disk spool. "
                    "Under torchrun (--no-python) RANK/WORLD_SIZE are picked up from the env.")
    p.add_argument("--bootstrap", default=os.environ.get("FAULTWATCH_BOOTSTRAP"),
                   help="Kafka HOST:PORT (default $FAULTWATCH_BOOTSTRAP)")
    p.add_argument("--job", required=True, help="job name")
    p.add_argument("--node", default=None, help="node name (default: hostname)")
    p.add_argument("--topic-prefix", default=None,
                   help="topic prefix (default $FAULTWATCH_TOPIC_PREFIX or 'faultwatch.')")
    p.add_argument("--heartbeat-s", type=float, default=2.0, help="heartbeat interval")
    p.add_argument("--spool-dir", default=None,
                   help="spool root (default $FAULTWATCH_SPOOL_DIR or ~/.faultwatch/spool)")
    p.add_argument("--attempt", type=int, default=0, help="attempt number of the job")
    p.add_argument("--rank", type=int, default=None, help="rank (default $RANK)")
    p.add_argument("--term-grace-s", type=float, default=10.0,
                   help="SIGTERM to SIGKILL escalation when the agent is signalled")
    p.add_argument("--exit-flush-timeout-s", type=float, default=10.0,
                   help="how long to wait for acks at exit; the rest stays spooled")
    p.add_argument("--max-line-bytes", type=int, default=65536)
    p.add_argument("--spool-cap-mb", type=int, default=256)
    p.add_argument("--flush", action="store_true",
                   help="no command: deliver what an earlier agent left in the spool, exit")
    p.add_argument("cmd", nargs=argparse.REMAINDER, help="-- CMD [ARGS...]")
    p.set_defaults(func=run)
    return p


def config_from_args(args: argparse.Namespace) -> AgentConfig:
    cmd = list(args.cmd)
    if cmd and cmd[0] == "--":
        cmd = cmd[1:]
    if not cmd and not args.flush:
        raise ConfigError("cmd", "no command given: faultwatch agent --job J -- CMD [ARGS...]")
    return AgentConfig.from_env_defaults(
        bootstrap=args.bootstrap, job=args.job, node=args.node, cmd=tuple(cmd),
        topic_prefix=args.topic_prefix, attempt=args.attempt, heartbeat_s=args.heartbeat_s,
        spool_dir=args.spool_dir, rank=args.rank, term_grace_s=args.term_grace_s,
        exit_flush_timeout_s=args.exit_flush_timeout_s, max_line_bytes=args.max_line_bytes,
        spool_cap_bytes=args.spool_cap_mb << 20)


def run(args: argparse.Namespace) -> int:
    """func for set_defaults: returns the child's exit code (or the flush result)."""
    return main_sync(config_from_args(args), flush_only=bool(args.flush))


def main(argv: list[str] | None = None) -> int:
    """Standalone entry (python -m faultwatch.agents.cli) until the lead's CLI wires it in."""
    parser = argparse.ArgumentParser(prog="faultwatch")
    sub = parser.add_subparsers(dest="command", required=True)
    register(sub)
    args = parser.parse_args(argv)
    try:
        return int(args.func(args))
    except ConfigError as e:
        parser.error(str(e))
        return 2


if __name__ == "__main__":
    raise SystemExit(main())
