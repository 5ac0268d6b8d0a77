"""`faultwatch run` (embedded mode): the agent's supervisor over an in-process transport that
runs the processor's stages (streams.local) instead of Kafka; its flags and its wiring."""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, TextIO

from faultwatch.cli import options
from faultwatch.errors import UsageError
from faultwatch.eventlog import log_event

if TYPE_CHECKING:  # the wiring's imports are made when `run` runs: every command builds the tree
    from faultwatch.agents.config import AgentConfig
    from faultwatch.agents.transport import LocalTransport
    from faultwatch.core.events import Decision
    from faultwatch.rules import RuleSet

HEARTBEAT_S = 0.5  # in-process heartbeats and ticks are cheap; they bound hang latency


@dataclass(frozen=True)
class EmbeddedConfig:
    """What `faultwatch run` was asked to do."""

    cmd: tuple[str, ...]
    rule_paths: tuple[str, ...] = ()
    policy_overrides: dict[str, Any] = field(default_factory=dict)
    decisions_out: Path | None = None
    job: str = "local"
    node: str = "local"
    term_grace_s: float = 10.0
    decision_wait_s: float = 60.0
    sdk: bool = True
    reload_rules: bool = True


class _Rules:
    """The rule files behind embedded mode: re-read when one of them changes; an invalid
    edit is refused (the last good set stays in effect), a valid one goes to `apply`."""

    def __init__(self, paths: Sequence[str], apply: Callable[[RuleSet], None]) -> None:
        self.paths = list(paths)
        self._apply = apply
        self._mtimes = self._stat()

    def _stat(self) -> tuple[float, ...]:
        return tuple(Path(p).stat().st_mtime if Path(p).exists() else 0.0 for p in self.paths)

    def maybe_reload(self) -> None:
        mtimes = self._stat()
        if mtimes == self._mtimes:
            return
        self._mtimes = mtimes
        from faultwatch.rules import load_ruleset

        try:
            rs = load_ruleset(self.paths)
        except Exception as e:  # noqa: BLE001 - keep the last good rule set, say why
            log_event("rules_reload_rejected", errors=str(e).replace("\n", " | "))
            return
        self._apply(rs)
        log_event("rules_reloaded", version=rs.version)


def publisher(out: TextIO, decisions_out: Path | None) -> Callable[[Decision], None]:
    """Embedded mode's decisions "topic": printed for a person (not the `diagnose` probes
    the processor sends the agent during a silence: they are machinery, not news), appended
    as JSON lines."""
    import orjson

    from faultwatch.core.diagnosis import DIAGNOSE_KIND
    from faultwatch.readers.render import render_decision
    from faultwatch.wire import decision_to_dict

    def publish(d: Decision) -> None:
        if not (d.action == "notify" and d.kind == DIAGNOSE_KIND):
            print(render_decision(d), file=out, flush=True)
        if decisions_out is not None:
            with open(decisions_out, "ab") as f:
                f.write(orjson.dumps(decision_to_dict(d)) + b"\n")
    return publish


def transport_for(cfg: EmbeddedConfig, out: TextIO = sys.stderr) -> LocalTransport:
    """The processor's stages in-process (streams.local.LocalPipeline) behind a
    LocalTransport; changed rule files swap the pipeline's rules as a rules push does."""
    from faultwatch.agents.transport import LocalTransport
    from faultwatch.core.policy import policy_for
    from faultwatch.rules import Matcher, load_ruleset
    from faultwatch.streams.local import LocalPipeline

    ruleset = load_ruleset(cfg.rule_paths)
    pipeline = LocalPipeline(ruleset, policy_for(ruleset.policy, cfg.policy_overrides))

    def apply(rs: RuleSet) -> None:
        live = pipeline.live
        live.matcher = Matcher(rs)
        live.policy = policy_for(rs.policy, cfg.policy_overrides)
        live.rules_version = rs.version

    rules = _Rules(cfg.rule_paths, apply)
    return LocalTransport(pipeline, cfg.job, publisher(out, cfg.decisions_out), time.time,
                          tick_s=HEARTBEAT_S,
                          on_tick=rules.maybe_reload if cfg.reload_rules else None)


def agent_config(cfg: EmbeddedConfig) -> AgentConfig:
    """The agent's configuration for one node that follows its own decisions."""
    from faultwatch.agents.config import AgentConfig

    return AgentConfig(bootstrap="", job=cfg.job, node=cfg.node, cmd=cfg.cmd,
                       spool_dir=Path(tempfile.gettempdir()), heartbeat_s=HEARTBEAT_S,
                       heartbeat_flowing_s=HEARTBEAT_S,  # in process: no record to save
                       term_grace_s=cfg.term_grace_s, follow_decisions=True,
                       decision_wait_s=cfg.decision_wait_s, sdk=cfg.sdk)


def run_embedded(cfg: EmbeddedConfig) -> int:
    """Entry point of `faultwatch run`: the agent, with the processor in-process."""
    from faultwatch.agents.entry import main_sync

    return main_sync(agent_config(cfg), transport=transport_for(cfg), component="run")


# ---- the command ---------------------------------------------------------------------------

def wrapped_command(args: argparse.Namespace) -> tuple[str, ...]:
    """The training command given after `--` (tree.split_command), else a UsageError."""
    if not args.cmd:
        raise UsageError(f"no command given: put it after --, e.g. "
                         f"`faultwatch {args.command} -- torchrun ...`")
    return tuple(args.cmd)


def cmd_run(args: argparse.Namespace) -> int:
    from faultwatch.eventlog import set_component

    set_component("run")
    cfg = EmbeddedConfig(cmd=wrapped_command(args), rule_paths=tuple(args.rules or ()),
                         policy_overrides=options.policy_overrides(args),
                         decisions_out=Path(args.decisions_out) if args.decisions_out else None,
                         job=args.job, term_grace_s=args.term_grace_s)
    return run_embedded(cfg)


def register(sub: Any) -> None:
    p = sub.add_parser("run", help="embedded mode: supervise CMD in-process, no Kafka",
                       usage="faultwatch run [options] -- CMD [ARGS...]")
    p.hint = "the training command goes after --: faultwatch run [options] -- CMD [ARGS...]"
    options.add_rules(p)
    p.add_argument("--decisions-out", metavar="FILE", help="append decisions as JSON lines")
    p.add_argument("--job", default="local", help="job name used in decisions")
    p.add_argument("--term-grace-s", type=float, default=10.0,
                   help="SIGTERM -> SIGKILL grace when stopping the command")
    options.add_policy(p)
    p.set_defaults(func=cmd_run)
