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
from faultwatch.rules import Matcher, RuleSet, layers
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
    """The rule files behind embedded mode: the layers built-in + files (+ flags), built by
    rules.layers like a processor's, re-built when one of the files changes; an invalid
    edit is refused (the last good set stays in effect), a valid one goes to `apply`.

    The files are stat'ed BEFORE they are read: an edit made while the set is read and
    compiled (seconds at start) differs from that stat and is applied at the first tick
    (stat'ing after the compile lost such edits)."""

    def __init__(self, paths: Sequence[str], flags: dict[str, Any]) -> None:
        self.paths = list(paths)
        self.flags = dict(flags)
        self.apply: Callable[[layers.RulesInForce], object] = lambda rules: None
        self._stats = self._stat()  # before the read: see the class docstring
        self.rules = layers.load(self.paths, flags=self.flags)

    def _stat(self) -> tuple[tuple[int, int, int], ...]:
        out = []
        for p in self.paths:
            try:
                st = Path(p).stat()
                out.append((st.st_mtime_ns, st.st_size, st.st_ino))
            except OSError:
                out.append((0, 0, 0))
        return tuple(out)

    def maybe_reload(self) -> None:
        stats = self._stat()
        if stats == self._stats:
            return
        self._stats = stats
        rules, problems = layers.build([layers.builtin_layer(), layers.files_layer(self.paths)],
                                       self.flags)
        if rules is None:  # keep the last good rule set, say why
            log_event("rules_reload_rejected", kept=self.rules.version, count=len(problems),
                      errors=" | ".join(str(p) for p in problems))
            return
        if rules.version == self.rules.version:
            return  # touched or rewritten alike: nothing changes
        previous = self.rules.version
        self.apply(rules)
        self.rules = rules
        log_event("rules_reloaded", version=rules.version, previous=previous,
                  files=",".join(self.paths))


def policy_for(ruleset: RuleSet, overrides: dict[str, Any]) -> Policy:
    """Policy defaults, then the rule files' `policy:` sections, then flags (what
    rules.layers.build does; kept for callers holding a merged rule set)."""
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

    rules = _Rules(cfg.rule_paths, cfg.policy_overrides)
    pipeline = LocalPipeline(rules.rules.ruleset, rules.rules.policy)
    pipeline.live.rules = rules.rules
    rules.apply = lambda new: pipeline.live.swap(new, Matcher(new.ruleset))
    log_event("rules_loaded", version=rules.rules.version, rules=len(rules.rules.ruleset.rules),
              source=rules.rules.source, layers="+".join(la.name for la in rules.rules.layers),
              files=",".join(cfg.rule_paths) or None)
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
