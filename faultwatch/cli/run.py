"""`faultwatch run` (embedded mode): the agent's supervisor over an in-process transport that
runs the processor's stages (streams.local) instead of Kafka; its flags and its wiring."""

from __future__ import annotations

import argparse
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, TextIO

from faultwatch import settings
from faultwatch.agents.config import EXIT_UNDECIDED, AgentConfig
from faultwatch.cli import options
from faultwatch.eventlog import log_event

if TYPE_CHECKING:  # the wiring's imports are made when `run` runs: every command builds the tree
    from faultwatch.agents.config import AgentConfig
    from faultwatch.agents.transport import LocalTransport
    from faultwatch.core.events import Decision
    from faultwatch.rules import layers

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
    incidents_out: Path | None = None  # the run ledgers (incidents, goodput), as JSON lines


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
        from faultwatch.rules import layers

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
        from faultwatch.rules import layers

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


def publisher(out: TextIO | None, decisions_out: Path | None) -> Callable[[Decision], None]:
    """Embedded mode's decisions "topic": appended as JSON lines (and printed on `out` when
    given; `faultwatch run` passes none: its agent prints one block per decision it reads,
    in order with the command's own stderr). The `diagnose` probes never come here: the
    LocalTransport routes them to its control channel, as the processor puts them on
    <prefix>control (they are machinery, not news); a hang's decision says which probes were
    sent and what they found."""
    import orjson

    from faultwatch.core.diagnosis import is_probe
    from faultwatch.readers.render import render_decision
    from faultwatch.wire import decision_to_dict

    def publish(d: Decision) -> None:
        if out is not None and not is_probe(d):  # only when a caller publishes a probe itself
            print(render_decision(d), file=out, flush=True)
        if decisions_out is not None:
            with open(decisions_out, "ab") as f:
                f.write(orjson.dumps(decision_to_dict(d)) + b"\n")
    return publish


def transport_for(cfg: EmbeddedConfig, out: TextIO | None = None) -> LocalTransport:
    """The processor's stages in-process (streams.local.LocalPipeline) behind a
    LocalTransport; changed rule files swap the pipeline's rules as a rules push does."""
    from faultwatch.agents.transport import LocalTransport
    from faultwatch.rules import Matcher
    from faultwatch.streams.local import LocalPipeline

    rules = _Rules(cfg.rule_paths, cfg.policy_overrides)
    pipeline = LocalPipeline(rules.rules.ruleset, rules.rules.policy)
    pipeline.live.rules = rules.rules
    rules.apply = lambda new: pipeline.live.swap(new, Matcher(new.ruleset))
    log_event("rules_loaded", version=rules.rules.version, rules=len(rules.rules.ruleset.rules),
              source=rules.rules.source, layers="+".join(la.name for la in rules.rules.layers),
              files=",".join(cfg.rule_paths) or None)

    def on_tick() -> None:
        if cfg.reload_rules:
            rules.maybe_reload()
        write_ledgers(cfg.incidents_out, pipeline.ledgers(time.time()))

    return LocalTransport(pipeline, cfg.job, publisher(out, cfg.decisions_out), time.time,
                          tick_s=HEARTBEAT_S, on_tick=on_tick,
                          publish_control=_appender(cfg.control_out))


def write_ledgers(path: Path | None, records: list[tuple[bytes, bytes]]) -> None:
    """Embedded mode's incidents "topic": each run ledger record as a JSON line."""
    if path is None or not records:
        return
    with open(path, "ab") as f:
        for _key, value in records:
            f.write(value + b"\n")


def report_goodput(transport: LocalTransport, cfg: EmbeddedConfig, err: TextIO) -> None:
    """At the end of `run`: the final ledger to --incidents-out and one goodput line."""
    from faultwatch.streams.local import LocalPipeline

    pipeline = transport.pipeline
    assert isinstance(pipeline, LocalPipeline)
    now = time.time()
    write_ledgers(cfg.incidents_out, pipeline.ledgers(now))
    write_ledgers(cfg.incidents_out, pipeline.ledgers(now, final=True))
    acc = pipeline.account(cfg.job)
    if acc is not None and acc.wall_s > 0:
        print(f"faultwatch: {acc.line()}", file=err, flush=True)


def _appender(path: Path | None) -> Callable[[Decision], None] | None:
    if path is None:
        return None
    import orjson

    from faultwatch.wire import decision_to_dict

    def append(d: Decision) -> None:
        with open(path, "ab") as f:
            f.write(orjson.dumps(decision_to_dict(d)) + b"\n")
    return append


def agent_config(cfg: EmbeddedConfig) -> AgentConfig:
    """The agent's configuration for one node that follows its own decisions."""
    from faultwatch.agents.config import AgentConfig

    return AgentConfig(bootstrap="", job=cfg.job, node=cfg.node, cmd=cfg.cmd,
                       spool_dir=Path(tempfile.gettempdir()), heartbeat_s=HEARTBEAT_S,
                       heartbeat_flowing_s=HEARTBEAT_S,  # in process: no record to save
                       term_grace_s=cfg.term_grace_s, follow_decisions=True,
                       decision_wait_s=cfg.decision_wait_s, sdk=cfg.sdk,
                       verdict_out=cfg.verdict_out, on_restart=cfg.on_restart,
                       attempt=cfg.attempt)


def run_embedded(cfg: EmbeddedConfig) -> int:
    """Entry point of `faultwatch run`: the agent, with the processor in-process."""
    import sys

    from faultwatch.agents.entry import main_sync
    from faultwatch.readers.render import render_decision

    transport = transport_for(cfg)
    code = main_sync(agent_config(cfg), transport=transport, component="run",
                     render=render_decision)
    report_goodput(transport, cfg, sys.stderr)
    return code


# ---- the command ---------------------------------------------------------------------------

def cmd_run(args: argparse.Namespace) -> int:
    from faultwatch.eventlog import set_component

    set_component("run")
    cfg = EmbeddedConfig(cmd=options.wrapped_command(args), rule_paths=tuple(args.rules or ()),
                         policy_overrides=options.policy_overrides(args),
                         decisions_out=Path(args.decisions_out) if args.decisions_out else None,
                         job=args.job, term_grace_s=args.term_grace_s,
                         decision_wait_s=args.decision_wait_s,
                         verdict_out=Path(args.verdict_out) if args.verdict_out else None,
                         on_restart=args.on_restart,
                         control_out=Path(args.control_out) if args.control_out else None,
                         attempt=_run_attempt(),
                         incidents_out=Path(args.incidents_out) if args.incidents_out else None)
    if not args.no_check:
        _check(args, cfg)
    return run_embedded(cfg)


def _check(args: argparse.Namespace, cfg: EmbeddedConfig) -> None:
    """The timeout chain once before the launch (cli/check.py): the run's own policy, its
    in-process heartbeats, nothing to flush at exit."""
    from faultwatch.cli import check
    from faultwatch.launch.model import Setting

    given = {"term_grace_s": args.term_grace_s != 10.0,
             "decision_wait_s": args.decision_wait_s != 60.0}
    agent = check.agent_settings({"term_grace_s": cfg.term_grace_s,
                                  "decision_wait_s": cfg.decision_wait_s}, given)
    for key in ("agent.heartbeat_s", "agent.heartbeat_flowing_s"):
        agent[key] = Setting(key, HEARTBEAT_S, "derived", "in process (faultwatch run)")
    agent["agent.exit_flush_timeout_s"] = Setting("agent.exit_flush_timeout_s", 0.0,
                                                  "derived", "in process: nothing to flush")
    fw = check.faultwatch_side(cfg.rule_paths, cfg.policy_overrides, agent)
    check.preflight(cfg.cmd, fw, strict=args.strict, component="run")


def _run_attempt() -> int:
    """`run`'s first attempt: $FAULTWATCH_ATTEMPT (a relauncher's count), else 0."""
    return settings.ATTEMPT.value()


def register(sub: Any) -> None:
    p = sub.add_parser("run", help="embedded mode: supervise CMD in-process, no Kafka",
                       usage="faultwatch run [options] -- CMD [ARGS...]")
    p.hint = "the training command goes after --: faultwatch run [options] -- CMD [ARGS...]"
    options.add_rules(p)
    p.add_argument("--decisions-out", metavar="FILE", help="append decisions as JSON lines")
    p.add_argument("--incidents-out", metavar="FILE",
                   help="append the run's ledger (incidents, goodput) as JSON lines, for "
                        "`faultwatch report --from FILE`")
    p.add_argument("--control-out", metavar="FILE",
                   help="append the control requests (diagnosis probes) as JSON lines")
    p.add_argument("--job", default="local", help="job name used in decisions")
    p.add_argument("--term-grace-s", type=float,
                   default=options.default_of(AgentConfig, "term_grace_s"),
                   help="SIGTERM -> SIGKILL grace when stopping the command")
    p.add_argument("--decision-wait-s", type=float,
                   default=options.default_of(AgentConfig, "decision_wait_s"),
                   help="after the command failed, how long to wait for the decision "
                        f"(none: exit {EXIT_UNDECIDED})")
    options.add_verdict(p)
    options.add_check(p)
    options.add_logging(p, "warning")
    options.add_policy(p)
    p.set_defaults(func=cmd_run)
