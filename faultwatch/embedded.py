"""Embedded mode (`faultwatch run`): the agent's supervisor over an in-process transport."""

from __future__ import annotations

import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO

import orjson

from faultwatch.agents.config import AgentConfig
from faultwatch.agents.transport import LocalTransport
from faultwatch.core.diagnosis import is_probe
from faultwatch.core.events import Decision
from faultwatch.core.policy import Policy
from faultwatch.logs import log_event
from faultwatch.render import render_decision
from faultwatch.rules import Matcher, RuleSet, load_ruleset
from faultwatch.wire import decision_to_dict

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
    verdict_out: Path | None = None
    on_restart: str = "relaunch"
    control_out: Path | None = None  # the in-process control channel (probes), as JSON lines
    attempt: int = 0  # a relauncher's attempt ($FAULTWATCH_ATTEMPT: a shell loop, --on-restart)


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
        try:
            rs = load_ruleset(self.paths)
        except Exception as e:  # noqa: BLE001 - keep the last good rule set, say why
            log_event("rules_reload_rejected", errors=str(e).replace("\n", " | "))
            return
        self._apply(rs)
        log_event("rules_reloaded", version=rs.version)


def policy_for(ruleset: RuleSet, overrides: dict[str, Any]) -> Policy:
    """Policy defaults, then the rule files' `policy:` sections, then flags."""
    return Policy().with_overrides(dict(ruleset.policy)).with_overrides(overrides)


def publisher(out: TextIO, decisions_out: Path | None) -> Callable[[Decision], None]:
    """Embedded mode's decisions "topic": printed for a person, appended as JSON lines. The
    `diagnose` probes never come here: the LocalTransport routes them to its control channel,
    as the processor puts them on <prefix>control (they are machinery, not news); a hang's
    decision says which probes were sent and what they found."""
    def publish(d: Decision) -> None:
        if not is_probe(d):  # only when a caller publishes a probe itself
            print(render_decision(d), file=out, flush=True)
        if decisions_out is not None:
            with open(decisions_out, "ab") as f:
                f.write(orjson.dumps(decision_to_dict(d)) + b"\n")
    return publish


def transport_for(cfg: EmbeddedConfig, out: TextIO = sys.stderr) -> LocalTransport:
    """The processor's stages in-process (streams.local.LocalPipeline) behind a
    LocalTransport; changed rule files swap the pipeline's rules as a rules push does."""
    from faultwatch.streams.local import LocalPipeline

    ruleset = load_ruleset(cfg.rule_paths)
    pipeline = LocalPipeline(ruleset, policy_for(ruleset, cfg.policy_overrides))

    def apply(rs: RuleSet) -> None:
        live = pipeline.live
        live.matcher = Matcher(rs)
        live.policy = policy_for(rs, cfg.policy_overrides)
        live.rules_version = rs.version

    rules = _Rules(cfg.rule_paths, apply)
    return LocalTransport(pipeline, cfg.job, publisher(out, cfg.decisions_out), time.time,
                          tick_s=HEARTBEAT_S,
                          on_tick=rules.maybe_reload if cfg.reload_rules else None,
                          publish_control=_appender(cfg.control_out))


def _appender(path: Path | None) -> Callable[[Decision], None] | None:
    if path is None:
        return None

    def append(d: Decision) -> None:
        with open(path, "ab") as f:
            f.write(orjson.dumps(decision_to_dict(d)) + b"\n")
    return append


def agent_config(cfg: EmbeddedConfig) -> AgentConfig:
    """The agent's configuration for one node that follows its own decisions."""
    return AgentConfig(bootstrap="", job=cfg.job, node=cfg.node, cmd=cfg.cmd,
                       spool_dir=Path(tempfile.gettempdir()), heartbeat_s=HEARTBEAT_S,
                       heartbeat_flowing_s=HEARTBEAT_S,  # in process: no record to save
                       term_grace_s=cfg.term_grace_s, follow_decisions=True,
                       decision_wait_s=cfg.decision_wait_s, sdk=cfg.sdk,
                       verdict_out=cfg.verdict_out, on_restart=cfg.on_restart,
                       attempt=cfg.attempt)


def run_embedded(cfg: EmbeddedConfig) -> int:
    """Entry point of `faultwatch run`: the agent, with the processor in-process."""
    from faultwatch.agents.entry import main_sync

    return main_sync(agent_config(cfg), transport=transport_for(cfg), component="run")
