"""The one exception tree of faultwatch; every error carries the data a caller acts on."""

from __future__ import annotations

from dataclasses import dataclass


class FaultwatchError(Exception):
    """Root of every error faultwatch raises on purpose."""


@dataclass(frozen=True)
class RuleProblem:
    """One problem found in a rule file, located by path and line."""

    path: str
    line: int
    message: str
    rule_id: str | None = None

    def __str__(self) -> str:
        return f"{self.path}:{self.line}: {self.message}"


class RuleError(FaultwatchError):
    """A rule set is invalid; holds every problem found, not just the first."""

    def __init__(self, problems: list[RuleProblem]):
        self.problems = list(problems)
        super().__init__("\n".join(str(p) for p in self.problems))


class ConfigError(FaultwatchError):
    """A configuration value (flag, environment, policy section) is invalid."""

    def __init__(self, key: str, message: str):
        self.key = key
        super().__init__(f"{key}: {message}")


class DecodeError(FaultwatchError):
    """A wire record could not be decoded; carries where it came from."""

    def __init__(self, message: str, topic: str | None = None, partition: int | None = None,
                 offset: int | None = None):
        self.topic, self.partition, self.offset = topic, partition, offset
        where = f"{topic}[{partition}]@{offset}: " if topic is not None else ""
        super().__init__(f"{where}{message}")


class BrokerError(FaultwatchError):
    """The local Kafka broker could not be resolved, started, reached or stopped."""


class ChildError(FaultwatchError):
    """The supervised command could not be started."""
