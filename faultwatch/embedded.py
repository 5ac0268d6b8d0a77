"""Embedded mode: supervise one command with the pure core in-process, no Kafka."""

from __future__ import annotations

import asyncio
import os
import signal
import sys
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO

import orjson

from faultwatch import __version__
from faultwatch.agents.child import Child, ExitStatus
from faultwatch.agents.reader import LineSplitter, pump
from faultwatch.core.events import Decision, Exit, Heartbeat, Line, RunStart, Signal
from faultwatch.core.job import JobState, Phase, apply, tick
from faultwatch.core.matching import signals_of_exit, signals_of_lines
from faultwatch.core.policy import Policy
from faultwatch.logs import log_event
from faultwatch.render import render_decision
from faultwatch.rules import Matcher, RuleSet, load_ruleset
from faultwatch.wire import decision_to_dict

HEARTBEAT_S = 0.5  # in-process heartbeats are cheap; they bound hang-detection latency


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
    reload_rules: bool = True


class _Rules:
    """The rule set in effect, reloaded when one of its files changes (last good one kept)."""

    def __init__(self, paths: Sequence[str], on_event: Callable[..., None]) -> None:
        self.paths = list(paths)
        self.ruleset: RuleSet = load_ruleset(self.paths)
        self.matcher = Matcher(self.ruleset)
        self._mtimes = self._stat()
        self._log = on_event

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
            self._log("rules_reload_rejected", errors=str(e).replace("\n", " | "))
            return
        self.ruleset, self.matcher = rs, Matcher(rs)
        self._log("rules_reloaded", version=rs.version)


class EmbeddedRunner:
    """Runs attempts of the command until the job succeeds or a `fail` decision is made."""

    def __init__(self, cfg: EmbeddedConfig, out: TextIO = sys.stderr) -> None:
        self.cfg = cfg
        self.out = out
        self.rules = _Rules(cfg.rule_paths, lambda ev, **kv: log_event(ev, **kv))
        self.policy = policy_for(self.rules.ruleset, cfg.policy_overrides)
        self.state = JobState(job=cfg.job)
        self.run_id = f"g-{uuid.uuid4().hex}"  # one run: stable across its attempts
        self.decisions: list[Decision] = []
        self._wake = asyncio.Event()
        self._last_output_ts: float | None = None

    async def run(self) -> int:
        attempt = 0
        status = ExitStatus(exit_code=0, signal=None)
        stop_requested = False
        loop = asyncio.get_running_loop()
        child_box: list[Child] = []

        def on_term(signum: int) -> None:
            nonlocal stop_requested
            stop_requested = True
            if child_box:
                child_box[-1].signal_group(signum)

        for s in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(s, on_term, s)
        try:
            while True:
                child = await self._spawn(attempt)
                child_box.append(child)
                status, decision = await self._supervise(child, attempt)
                if stop_requested or decision is None or decision.action == "fail":
                    return status.exit_code
                attempt += 1
        finally:
            for s in (signal.SIGINT, signal.SIGTERM):
                loop.remove_signal_handler(s)

    async def _spawn(self, attempt: int) -> Child:
        env = dict(os.environ)
        env.update(FAULTWATCH_ATTEMPT=str(attempt), FAULTWATCH_JOB=self.cfg.job,
                   FAULTWATCH_NODE=self.cfg.node)
        child = await Child.spawn(self.cfg.cmd, env)
        now = time.time()
        self._last_output_ts = None
        self._feed(RunStart(job=self.cfg.job, attempt=attempt, node=self.cfg.node, ts=now,
                            run_id=self.run_id, run_source="generated",
                            host=os.uname().nodename, pid=child.pid, cmd=self.cfg.cmd,
                            agent_version=__version__), now)
        log_event("child_started", attempt=attempt, pid=child.pid)
        return child

    async def _supervise(self, child: Child, attempt: int) -> tuple[ExitStatus, Decision | None]:
        job, node = self.cfg.job, self.cfg.node
        started = time.time()

        def sink(lines: list[Line]) -> None:
            if not lines:
                return
            self._last_output_ts = lines[-1].ts
            self._feed(signals_of_lines(job, attempt, node, lines, self.rules.matcher,
                                        run_id=self.run_id),
                       time.time())

        pumps = [
            asyncio.create_task(pump(child.stdout, LineSplitter("stdout"), sys.stdout.fileno(),
                                     sink)),
            asyncio.create_task(pump(child.stderr, LineSplitter("stderr"), sys.stderr.fileno(),
                                     sink)),
        ]
        waiter = asyncio.create_task(child.wait())
        status: ExitStatus | None = None
        decision: Decision | None = None
        while True:
            try:
                await asyncio.wait_for(asyncio.shield(waiter), timeout=HEARTBEAT_S)
            except TimeoutError:
                pass
            now = time.time()
            if self.cfg.reload_rules:
                self.rules.maybe_reload()
            if waiter.done() and status is None:
                status = waiter.result()
                await asyncio.gather(*pumps, return_exceptions=True)
                self._feed(_exit_signal(job, attempt, node, now, status, self.rules.matcher,
                                        self.run_id), now)
            elif status is None:
                self._feed(Heartbeat(job=job, attempt=attempt, node=node, ts=now, alive=True,
                                     last_output_ts=self._last_output_ts, started_ts=started,
                                     run_id=self.run_id), now)
            self._tick(now)
            # notify decisions are warnings: printed, never acted on
            decision = next((d for d in self.decisions
                             if d.attempt == attempt and d.action != "notify"), None)
            if decision is not None:
                if status is None:
                    status = await child.stop(self.cfg.term_grace_s)
                    await asyncio.gather(*pumps, return_exceptions=True)
                return status, decision
            if status is not None and self.state.phase in (Phase.DONE, Phase.DECIDED):
                return status, None
            if status is not None and self.state.phase == Phase.RUNNING and status.exit_code == 0:
                return status, None

    def _feed(self, sig: Signal | list[Signal], now: float) -> None:
        for s in sig if isinstance(sig, list) else [sig]:
            self.state, decs = apply(self.state, s, now, self.policy, self.rules.ruleset.version)
            self._publish(decs)

    def _tick(self, now: float) -> None:
        self.state, decs = tick(self.state, now, self.policy, self.rules.ruleset.version)
        self._publish(decs)

    def _publish(self, decs: list[Decision]) -> None:
        for d in decs:
            self.decisions.append(d)
            print(render_decision(d), file=self.out, flush=True)
            if self.cfg.decisions_out is not None:
                with open(self.cfg.decisions_out, "ab") as f:
                    f.write(orjson.dumps(decision_to_dict(d)) + b"\n")


def _exit_signal(job: str, attempt: int, node: str, now: float, status: ExitStatus,
                 matcher: Matcher, run_id: str) -> list[Signal]:
    return signals_of_exit(Exit(job=job, attempt=attempt, node=node, ts=now,
                                exit_code=status.exit_code, signal=status.signal,
                                run_id=run_id), matcher)


def policy_for(ruleset: RuleSet, overrides: dict[str, Any]) -> Policy:
    """Policy defaults, then the rule files' `policy:` sections, then flags."""
    return Policy().with_overrides(dict(ruleset.policy)).with_overrides(overrides)


def run_embedded(cfg: EmbeddedConfig) -> int:
    """Entry point of `faultwatch run`."""
    return asyncio.run(EmbeddedRunner(cfg).run())
