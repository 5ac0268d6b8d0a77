"""Embedded mode's in-process processor: the matcher stage and the job stage of cluster mode,
chained directly (one partition, states in memory, no Kafka, no Faust)."""

from __future__ import annotations

from collections.abc import Callable

from faultwatch.core.events import Decision
from faultwatch.core.goodput import Account, account
from faultwatch.core.policy import Policy
from faultwatch.errors import DecodeError
from faultwatch.eventlog import log_event
from faultwatch.registry.gate import NodeGate
from faultwatch.registry.writer import RegistryWriter
from faultwatch.rules import Matcher, RuleSet
from faultwatch.streams.counters import Metrics
from faultwatch.streams.incident_publish import IncidentPublisher
from faultwatch.streams.job_stage import DictStore, JobStage
from faultwatch.streams.lemon_watch import LemonFeed
from faultwatch.streams.matcher_stage import MatcherStage
from faultwatch.streams.records import DeadLetter, InRecord, LiveRules

LOGS, SIGNALS = "local.logs", "local.signals"  # topic names in dead letters


def log_dead_letter(rec: InRecord, err: Exception) -> None:
    """Embedded mode's dead letters: one structured event each."""
    err_text = str(err) if isinstance(err, DecodeError) else f"{type(err).__name__}: {err}"
    log_event("dead_letter", topic=rec.topic, partition=rec.partition, offset=rec.offset,
              error=err_text)


class LocalPipeline:
    """submit() a logs-topic record (key, value) and get the decisions it leads to; tick()
    advances processor time (settle fallback; node-lost once the grace has passed, unless
    `node_lost` is False). `live` holds the matcher, policy and rules version in effect:
    swap them together to reload rules."""

    def __init__(self, ruleset: RuleSet, policy: Policy, *,
                 dead_letter: DeadLetter = log_dead_letter,
                 matcher: Callable[[RuleSet], Matcher] = Matcher,
                 node_lost: bool = True) -> None:
        self.live = LiveRules(matcher(ruleset), policy, ruleset.version)
        self.metrics = Metrics()
        self.store = DictStore()
        self.matcher = MatcherStage(self.live, dead_letter, self.metrics)
        self.jobs = JobStage(self.live, self.store, dead_letter, self.metrics)
        self.jobs.node_lost = node_lost
        self.nodes = RegistryWriter()  # no nodes topic here: the registry lives in memory
        self.jobs.gate = NodeGate(self.nodes.quarantined, self.nodes.state)
        self.incidents = IncidentPublisher()  # the incidents "topic": ledgers() takes them
        self.lemons = LemonFeed()
        self.lemon_decisions: list[Decision] = []  # embedded: one job, none expected
        self._logs_offset = 0
        self._signals_offset = 0

    def submit(self, key: bytes, value: bytes, now: float) -> list[Decision]:
        rec = InRecord(LOGS, 0, self._logs_offset, key, value)
        self._logs_offset += 1
        out = self.matcher.process_batch([rec], now)
        sigs = []
        for k, v in out:
            sigs.append(InRecord(SIGNALS, 0, self._signals_offset, k, v))
            self._signals_offset += 1
        decs = self.jobs.process_batch(sigs, now)
        self.nodes.updates(decs, now)
        return decs

    def tick(self, now: float) -> list[Decision]:
        decs = self.jobs.tick(0, now, now)
        self.nodes.updates(decs, now)
        return decs

    def ledgers(self, now: float, final: bool = False) -> list[tuple[bytes, bytes]]:
        """The run ledgers due on the incidents "topic" (streams.incident_publish), or
        (`final`) every job's once more, marked final. The lemon feed sees them too."""
        parts = list(self.jobs.parts.values())
        out = self.incidents.final(parts, now) if final else \
            self.incidents.due(parts, self.jobs.retired_ledgers, now)
        decs: list[Decision] = []
        for _key, value in out:
            decs += self.lemons.take(value, now, self.live.policy, self.live.rules_version)
        if decs:
            self.nodes.updates(decs, now)
            self.lemon_decisions += decs
        return out

    def account(self, job: str) -> Account | None:
        """The goodput account of `job`'s current run (None: no such job)."""
        from faultwatch.wire import job_key

        part = self.jobs.parts.get(0)
        st = None if part is None else self.jobs.load(job_key(job), part)
        return None if st is None else account(st.ledger)
