"""The matcher and job stages in one process for embedded mode (until streams.local lands)."""

from __future__ import annotations

from collections.abc import Callable

from faultwatch import wire
from faultwatch.core.events import Decision
from faultwatch.core.job import JobState, apply, new_state, tick
from faultwatch.core.matching import LineMatcher
from faultwatch.core.policy import Policy
from faultwatch.errors import DecodeError
from faultwatch.logs import log_event
from faultwatch.matching import signals_of_record


class InProcessPipeline:
    """submit(key, value, now) / tick(now) -> decisions, as streams.local.LocalPipeline.

    A logs record becomes signals (the matcher stage) folded into its job's state (the job
    stage). A record that does not decode is reported and dropped, never applied."""

    def __init__(self, matcher: Callable[[], LineMatcher], policy: Policy,
                 rules_version: Callable[[], str]):
        self._matcher = matcher
        self.policy = policy
        self._version = rules_version
        self.jobs: dict[str, JobState] = {}
        self.dead_letters = 0

    def submit(self, key: bytes, value: bytes, now: float) -> list[Decision]:
        try:
            sigs = signals_of_record(wire.decode_logs(value), self._matcher())
        except DecodeError as e:
            self.dead_letters += 1
            log_event("dead_letter", key=key.decode(errors="replace"), error=str(e))
            return []
        out: list[Decision] = []
        for sig in sigs:
            st = self.jobs.get(sig.job) or new_state(sig)  # only a run-start starts a job
            if st is None:
                continue
            st, decs = apply(st, sig, now, self.policy, self._version())
            self.jobs[sig.job] = st
            out.extend(decs)
        return out

    def tick(self, now: float) -> list[Decision]:
        out: list[Decision] = []
        for job, st in list(self.jobs.items()):
            self.jobs[job], decs = tick(st, now, self.policy, self._version())
            out.extend(decs)
        return out
