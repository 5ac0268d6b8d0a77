"""The `faultwatch process` worker: Faust's worker with a bounded, flushing stop on
SIGTERM/SIGINT (a second signal exits at once)."""

from __future__ import annotations

import asyncio
import os
import signal
import sys
import threading
import time
from typing import Any

from faust.worker import Worker

from faultwatch import settings
from faultwatch.errors import BrokerError
from faultwatch.eventlog import log_event
from faultwatch.streams import faust_compat, gcsettings
from faultwatch.streams.faust_app import Processor, ProcessorConfig, build_processor
from faultwatch.streams.records import LiveRules
from faultwatch.streams.stopping import StopReport, run_steps

DEFAULT_STOP_TIMEOUT_S = 10.0  # well under Kubernetes' 30 s grace period
EXIT_MARGIN_S = 0.5  # the flush ends this long before the bound: time to log and exit


def exit_now(code: int) -> None:
    """Leave the process at once (no Faust teardown: it could commit offsets of events that
    were fetched but never processed, or wait for a broker that is gone); the metrics
    address file goes (os._exit skips atexit)."""
    from faultwatch.metrics import remove_address_files

    remove_address_files()
    for f in (sys.stdout, sys.stderr):
        try:
            f.flush()
        except (OSError, ValueError):
            pass
    os._exit(code)


def exit_on_early_signal() -> None:
    """Before the worker runs (topics, rules catch-up) there is nothing to flush: a stop
    signal exits 0 at once."""
    def handler(signum: int, frame: Any) -> None:
        log_event("processor_stopped", signal=signal.Signals(signum).name, phase="startup",
                  stop_s=0.0)
        exit_now(0)

    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, handler)


class ProcessorWorker(Worker):
    """On the first SIGTERM/SIGINT: stop consuming, let running batches finish (their
    decisions and signals are delivered inside the batch), write the write-behind job
    states, flush the producer, commit the processed offsets, leave the consumer group, exit
    0 -- all within `stop_timeout_s`. What does not fit (broker slow or gone) is given up
    and named in one `processor_stop_gave_up` event; the exit is still 0 and in time."""

    def __init__(self, proc: Processor, *, stop_timeout_s: float = DEFAULT_STOP_TIMEOUT_S,
                 **kwargs: Any) -> None:
        super().__init__(proc.app, **kwargs)
        # no terminal spinner: Faust installs it by setting the root logger to DEBUG, so
        # every debug call of aiokafka and Faust (one per produced record) built a record
        self.spinner = None
        self.proc = proc
        self.stop_timeout_s = stop_timeout_s
        self._stop_t0: float | None = None
        self._signal = ""
        self._step = ""
        self._exit_lock = threading.Lock()

    def install_signal_handlers(self) -> None:
        for sig in (signal.SIGTERM, signal.SIGINT):
            self.loop.add_signal_handler(sig, self.on_stop_signal, sig)

    def on_stop_signal(self, sig: signal.Signals) -> None:
        if self._stop_t0 is not None:
            log_event("processor_stop_forced", signal=sig.name, step=self._step,
                      stop_s=round(time.monotonic() - self._stop_t0, 3))
            exit_now(128 + sig.value)
        self._stop_t0 = time.monotonic()
        self._signal = sig.name
        log_event("processor_stopping", signal=sig.name, timeout_s=self.stop_timeout_s,
                  batches_in_flight=self.proc.gate.busy, dirty_states=self.proc.dirty_states())
        watchdog = threading.Thread(target=self._watchdog, name="faultwatch-stop-watchdog",
                                    daemon=True)
        watchdog.start()
        asyncio.ensure_future(self._stop(), loop=self.loop)

    def _steps(self) -> list[tuple[str, Any]]:
        app, gate = self.proc.app, self.proc.gate

        async def stop_consuming() -> None:
            app.consumer.stop_flow()
            app.consumer.pause_partitions(app.consumer.assignment())

        async def write_states() -> None:
            self.proc.flush_states()

        async def forget_worker() -> None:  # `rules show` / `status` stop listing us
            if self.proc.forget_worker is not None:
                await self.proc.forget_worker()

        async def deliver() -> None:
            await app.producer.flush()

        async def commit() -> None:
            await app.consumer.commit()

        async def leave_group() -> None:
            await faust_compat.leave_group(app)

        return [("stop_consuming", stop_consuming), ("finish_batches", gate.close),
                ("write_states", write_states), ("forget_worker", forget_worker),
                ("deliver", deliver), ("commit", commit),
                ("leave_group", leave_group)]

    async def _stop(self) -> None:
        assert self._stop_t0 is not None
        deadline = self._stop_t0 + self.stop_timeout_s - EXIT_MARGIN_S
        steps = self._steps()
        report = StopReport()
        try:
            report = await run_steps(self._tracked(steps), deadline)
        finally:
            self._finish(report)

    def _tracked(self, steps: list[tuple[str, Any]]) -> list[tuple[str, Any]]:
        def track(name: str, fn: Any) -> Any:
            async def run() -> object:
                self._step = name
                return await fn()
            return run
        return [(name, track(name, fn)) for name, fn in steps]

    def _finish(self, report: StopReport) -> None:
        if not self._exit_lock.acquire(blocking=False):
            return  # the watchdog is already exiting
        assert self._stop_t0 is not None
        stop_s = round(time.monotonic() - self._stop_t0, 3)
        if report.clean:
            log_event("processor_stopped", signal=self._signal, stop_s=stop_s,
                      steps=",".join(f"{k}:{v}" for k, v in report.done.items()))
        else:
            self._gave_up(stop_s, report.gave_up_in or self._step, report.error or "",
                          report.skipped)
        exit_now(0)

    def _gave_up(self, stop_s: float, step: str, error: str, skipped: list[str]) -> None:
        gate = self.proc.gate
        log_event("processor_stop_gave_up", signal=self._signal, stop_s=stop_s, step=step,
                  error=error, skipped=",".join(skipped) or None,
                  batches_unfinished=gate.busy, dirty_states_lost=self.proc.dirty_states(),
                  note="unfinished batches and uncommitted offsets are read again by the "
                       "partitions' next owner; unwritten states lose only liveness")

    def _watchdog(self) -> None:
        """Exits at the bound even if the event loop itself is stuck."""
        assert self._stop_t0 is not None
        time.sleep(max(0.0, self._stop_t0 + self.stop_timeout_s - 0.2 - time.monotonic()))
        if not self._exit_lock.acquire(blocking=False):
            return
        names = [n for n, _ in self._steps()]
        step = self._step or names[0]
        skipped = names[names.index(step) + 1:] if step in names else []
        self._gave_up(round(time.monotonic() - self._stop_t0, 3), step,
                      "event loop did not finish the stop in time", skipped)
        exit_now(0)


def run_worker(cfg: ProcessorConfig, *, stop_timeout_s: float = DEFAULT_STOP_TIMEOUT_S,
               loglevel: str = "warning") -> None:
    """Create the topics, load the rules topic's current set, then run the worker until a
    stop signal (exits the process)."""
    from faultwatch.kafka.admin import ensure_topics
    from faultwatch.rollout.rules_watch import RulesWatcher, base_rules
    from faultwatch.rules import Matcher

    exit_on_early_signal()
    live = LiveRules(Matcher(cfg.ruleset), cfg.policy, cfg.ruleset.version)
    watcher = RulesWatcher(cfg.bootstrap, cfg.topics.rules, live, base_rules(
        cfg.ruleset, cfg.policy, cfg.rules, cfg.policy_overrides))

    async def prepare() -> None:
        # strict=False: on a secured cluster the admin made the topics; one this worker may
        # not see nor create (another role's, like acted) is logged, not fatal
        await ensure_topics(cfg.bootstrap, cfg.topics, cfg.partitions,
                            incidents_retention_s=cfg.incidents_retention_s, strict=False)
        await watcher.catch_up_bounded()

    try:
        asyncio.run(prepare())
    except BrokerError as e:  # a first start reports it; a restarted startup tries again
        if settings.START_ATTEMPT.is_set():
            restart_startup(e.exit_code)
        raise
    asyncio.set_event_loop(asyncio.new_event_loop())
    proc = build_processor(cfg, live=live, watcher=watcher)
    log_event("processor_starting", bootstrap=cfg.bootstrap, group=cfg.group,
              rules_version=live.rules_version, rules=len(watcher.ruleset.rules),
              rules_source=watcher.rules.source,
              hang_window_s=live.policy.hang_window_s, settle_s=live.policy.settle_s)
    # redirect_stdouts=False: faultwatch's own event lines keep their format (Faust would log
    # every line written to stdout/stderr as a WARNING record: "[...] [WARNING] ts=...")
    worker = ProcessorWorker(proc, stop_timeout_s=stop_timeout_s, loglevel=loglevel,
                             quiet=True, redirect_stdouts=False)
    gcsettings.tune()  # the job states out of the cyclic collector's way (gcsettings.py)
    try:
        worker.execute_from_commandline()  # exits the process when the worker stops
    except SystemExit as e:
        if e.code not in (0, None) and not proc.assigned_once:
            restart_startup(e.code)
        raise


START_ATTEMPT_ENV = settings.START_ATTEMPT.name
START_ATTEMPTS_MAX = 8  # startups that fail before any assignment, then the error stands
START_BACKOFF_MAX_S = 60.0


def restart_startup(code: object) -> None:
    """Faust's startup failed before the worker got partitions (the broker went away while
    it declared its topics or joined the group: Faust gives up at once). Start the process
    afresh after a backoff (1, 2, 4 ... 60 s), at most START_ATTEMPTS_MAX times; returns
    (and the exit stands) past that."""
    attempt = settings.START_ATTEMPT.value() + 1
    if attempt > START_ATTEMPTS_MAX:
        log_event("processor_start_failed", attempts=attempt - 1, exit_code=code,
                  note="giving up: the broker did not stay reachable during startup")
        return
    backoff = min(START_BACKOFF_MAX_S, 2.0 ** (attempt - 1))
    log_event("processor_start_retry", attempt=attempt, of=START_ATTEMPTS_MAX,
              retry_in_s=backoff, exit_code=code,
              note="the worker stopped before it was assigned partitions")
    time.sleep(backoff)
    os.environ[START_ATTEMPT_ENV] = str(attempt)
    argv = list(getattr(sys, "orig_argv", []) or [sys.executable, *sys.argv])
    exit_flush = [f.flush for f in (sys.stdout, sys.stderr)]
    for flush in exit_flush:
        try:
            flush()
        except (OSError, ValueError):
            pass
    os.execv(sys.executable, [sys.executable, *argv[1:]])
