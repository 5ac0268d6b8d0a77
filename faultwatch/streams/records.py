"""What the stages read and write: a record with where it came from, the dead-letter callback
type and the rules in effect (swapped on a push). The size bound of produced records is
wire.MAX_RECORD_BYTES."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from faultwatch.core.matching import LineMatcher
from faultwatch.core.policy import Policy


@dataclass(frozen=True, slots=True)
class InRecord:
    """One consumed record: its topic, partition, offset, key and raw value."""

    topic: str
    partition: int
    offset: int
    key: bytes | None
    value: bytes | None

    @property
    def where(self) -> str:
        return f"{self.topic}[{self.partition}]@{self.offset}"


# the one way a stage reports a record it cannot use: (record, why); the shell sends it to
# the dead-letter topic (cluster mode) or logs it (embedded mode)
DeadLetter = Callable[[InRecord, Exception], None]


@dataclass
class LiveRules:
    """The rules in effect in a worker: matcher, policy and rules version change together
    when a rule set is pushed to the rules topic."""

    matcher: LineMatcher
    policy: Policy
    rules_version: str
