"""The one exception tree of faultwatch; every error carries the data a caller acts on."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

# The exit codes of the `faultwatch` command (docs/cli.md has the table). An error class
# carries its code; the CLI's one handler prints the error and exits with it. The agent's
# verdicts (75-78, agents/config.py) and a child's own exit code are results, not errors.
EXIT_OK = 0
EXIT_ERROR = 1  # a FaultwatchError without a more specific class; `rules diff --exit-code`: differ
EXIT_USAGE = 2  # bad arguments or configuration (argparse's own code)
EXIT_RULES = 3  # a rule set is invalid
EXIT_DECODE = 4  # a record could not be decoded
EXIT_BROKER = 5  # Kafka (or the local broker) could not be reached, started or stopped
EXIT_MISSING_EXTRA = 6  # the command needs an optional extra that is not installed
EXIT_NOT_FOUND = 7  # a topic the command reads, or a job it names, does not exist
EXIT_REFUSED = 8  # an operator write its consumers would refuse (unsigned, untrusted key)
EXIT_CHAIN = 9  # `check --strict` (and run/agent --strict): the job's timeouts do not nest
EXIT_CHILD_NOT_STARTED = 127  # the supervised command could not be started (as in a shell)
EXIT_INTERRUPTED = 130  # SIGINT (Ctrl-C)
EXIT_BROKEN_PIPE = 141  # 128+SIGPIPE: stdout's reader went away (`| head`)


class FaultwatchError(Exception):
    """Root of every error faultwatch raises on purpose."""

    exit_code: ClassVar[int] = EXIT_ERROR


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

    exit_code = EXIT_RULES

    def __init__(self, problems: list[RuleProblem]):
        self.problems = list(problems)
        super().__init__("\n".join(str(p) for p in self.problems))


class ConfigError(FaultwatchError):
    """A configuration value (flag, environment, policy section) is invalid."""

    exit_code = EXIT_USAGE

    def __init__(self, key: str, message: str):
        self.key = key
        super().__init__(f"{key}: {message}")


class DecodeError(FaultwatchError):
    """A wire record could not be decoded; carries where it came from."""

    exit_code = EXIT_DECODE

    def __init__(self, message: str, topic: str | None = None, partition: int | None = None,
                 offset: int | None = None):
        self.topic, self.partition, self.offset = topic, partition, offset
        where = f"{topic}[{partition}]@{offset}: " if topic is not None else ""
        super().__init__(f"{where}{message}")


class BrokerError(FaultwatchError):
    """Kafka, or the local broker, could not be resolved, started, reached or stopped."""

    exit_code = EXIT_BROKER


class ChildError(FaultwatchError):
    """The supervised command could not be started."""

    exit_code = EXIT_CHILD_NOT_STARTED


class UsageError(FaultwatchError):
    """The command line is wrong in a way argparse cannot see (e.g. no command after --)."""

    exit_code = EXIT_USAGE


class MissingExtraError(FaultwatchError):
    """A command needs an optional extra (e.g. `faultwatch[processor]`) that is not installed."""

    exit_code = EXIT_MISSING_EXTRA

    def __init__(self, extra: str, command: str, missing: str):
        self.extra, self.command, self.missing = extra, command, missing
        super().__init__(f"`faultwatch {command}` needs the {extra} extra ({missing} is not "
                         f"installed): pip install 'faultwatch[{extra}]'")


class NotFoundError(FaultwatchError):
    """What a command reads does not exist: a topic (a wrong --topic-prefix, or nothing has
    written to it yet), or a job the command names (`status JOB`, `logs JOB`)."""

    exit_code = EXIT_NOT_FOUND


class RefusedError(FaultwatchError):
    """An operator's write (a rule set, a node record, a hold) that the processors would
    refuse: unsigned, or signed by a key their trust file does not list as an operator's.
    The command that makes the write refuses it instead of printing success."""

    exit_code = EXIT_REFUSED


class BrokerAuthError(BrokerError):
    """Kafka refused our credentials or the TLS handshake (a configuration problem)."""


class ChainError(FaultwatchError):
    """With --strict, a link of the job's timeout chain is broken (docs/timeouts.md): the
    launch is refused before it runs."""

    exit_code = EXIT_CHAIN
