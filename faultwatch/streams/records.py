"""What the stages read and write: a record with where it came from, the dead-letter callback
type and the rules in effect (swapped on a push). The size bound of produced records is
wire.MAX_RECORD_BYTES."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from faultwatch.core.matching import LineMatcher
from faultwatch.core.policy import Policy


@dataclass(frozen=True, slots=True)
class InRecord:
    """One consumed record: its topic, partition, offset, key, raw value and headers."""

    topic: str
    partition: int
    offset: int
    key: bytes | None
    value: bytes | None
    headers: tuple[tuple[str, bytes], ...] = ()

    @property
    def where(self) -> str:
        return f"{self.topic}[{self.partition}]@{self.offset}"


# the one way a stage reports a record it cannot use: (record, why); the shell sends it to
# the dead-letter topic (cluster mode) or logs it (embedded mode)
DeadLetter = Callable[[InRecord, Exception], None]


@dataclass
class LiveRules:
    """The rules in effect in a worker: matcher, policy and rules version change together
    (`swap`) when a rule set is pushed (processors) or a rule file changes (embedded mode).
    `rules` is what they were built from (rules.layers.RulesInForce: layers, provenance)."""

    matcher: LineMatcher
    policy: Policy
    rules_version: str
    rules: Any = None

    def swap(self, rules: Any, matcher: LineMatcher) -> str:
        """The one live-rules swap: the matcher, policy, version and provenance of `rules`
        (a RulesInForce) replace the current ones together (synchronously: no batch sees a
        mix). Returns the previous version."""
        old = self.rules_version
        self.matcher = matcher
        self.policy = rules.policy
        self.rules_version = rules.version
        self.rules = rules
        return old
