"""Topic names (prefix configurable), how many partitions they get, and the keys that place a
record on a partition. Creating the topics is Kafka plumbing: faultwatch.kafka.admin."""

from __future__ import annotations

from dataclasses import dataclass

DEFAULT_PREFIX = "faultwatch."
DEFAULT_PARTITIONS = 4  # logs, signals, decisions, control (signals must match the job table's)
INCIDENTS_RETENTION_S = 30 * 86400.0  # the incidents and acted topics keep a run this long


@dataclass(frozen=True)
class Topics:
    """The names of faultwatch's topics under one prefix."""

    prefix: str = DEFAULT_PREFIX

    @property
    def logs(self) -> str:
        return f"{self.prefix}logs"

    @property
    def signals(self) -> str:
        return f"{self.prefix}signals"

    @property
    def decisions(self) -> str:
        return f"{self.prefix}decisions"

    @property
    def control(self) -> str:
        """Control traffic for the agents (diagnosis requests), keyed by job; schedulers,
        readers and notifiers never read it (docs/decisions.md, "Control topic")."""
        return f"{self.prefix}control"

    @property
    def deadletter(self) -> str:
        return f"{self.prefix}deadletter"

    @property
    def rules(self) -> str:
        return f"{self.prefix}rules"

    @property
    def status(self) -> str:
        return f"{self.prefix}status"

    @property
    def nodes(self) -> str:
        """The fleet-wide node registry (compacted, key = node)."""
        return f"{self.prefix}nodes"

    @property
    def holds(self) -> str:
        """Operators' holds and mutes of jobs (compacted, key = kind/job: wire/holds.py)."""
        return f"{self.prefix}holds"

    @property
    def incidents(self) -> str:
        """Each job run's ledger: incidents and goodput (compacted, key = job and run;
        written by processors, read by `faultwatch report` and the processors' lemon watch)."""
        return f"{self.prefix}incidents"

    @property
    def acted(self) -> str:
        """What actuators did for decisions (drains, taints), when (written by actuators,
        read by `faultwatch report`)."""
        return f"{self.prefix}acted"


def log_key(job: str, node: str) -> bytes:
    """Logs are keyed by job and node so a node's lines and lifecycle stay in order."""
    return f"{job}/{node}".encode()


def job_key(job: str) -> bytes:
    """Signals and decisions are keyed by job so one processor sees a whole job."""
    return job.encode()


def node_key(node: str) -> bytes:
    """Node records are keyed by node: the compacted topic keeps each node's latest."""
    return node.encode()
