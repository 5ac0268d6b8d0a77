"""The one table of faultwatch's topics and consumer groups: each topic's name under the prefix,
key, partitions, config, codec and which roles read and write it, and each group's name.

The clients (`Topics`), the topic creation (kafka/admin.py), the role ACLs (kafka/acls.py)
and the docs' role table (docs/operating.md) are derived from `TOPICS` and `GROUPS`; adding a
topic here is the whole change (tests/unit/wire/test_topics.py holds them to it)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from faultwatch import settings

DEFAULT_PREFIX = "faultwatch."
DEFAULT_PARTITIONS = 4  # logs, signals, decisions, control (signals must match the job table's)
# the incidents and acted topics keep a run this long ($FAULTWATCH_INCIDENTS_RETENTION_S)
INCIDENTS_RETENTION_S: float = settings.INCIDENTS_RETENTION_S.fallback

# The roles of the Kafka ACLs (kafka/acls.py): the node side, the Faust workers, the
# operating services (`actuate`, `notify`), operators (topics, ACLs, pushed records).
ROLES = ("agent", "processor", "actuator", "admin")
R, W, D = "read", "write", "describe"
COMPACT: Mapping[str, str] = {"cleanup.policy": "compact"}


@dataclass(frozen=True)
class Grant:
    """Role `role` may do `ops` on a topic or group, because `why`."""

    role: str
    ops: tuple[str, ...]
    why: str


@dataclass(frozen=True)
class TopicSpec:
    """One topic: `<prefix><suffix>`. `partitions` None is the installation's count
    (`--partitions`, DEFAULT_PARTITIONS); `created` names who creates it when missing:
    `processor` (kafka.admin.ensure_topics at its start) or `writer` (its own writer, with
    ensure_compacted_topic). `codec` is the `module:function` that decodes its values."""

    suffix: str
    key: str
    codec: str
    grants: tuple[Grant, ...]
    partitions: int | None = None
    config: Mapping[str, str] = field(default_factory=dict)
    created: str = "processor"
    doc: str = ""
    retention: bool = False  # retention.ms = the installation's incidents retention

    @property
    def compacted(self) -> bool:
        return self.config.get("cleanup.policy") == "compact"

    def name(self, prefix: str = DEFAULT_PREFIX) -> str:
        return f"{prefix}{self.suffix}"


TOPICS: tuple[TopicSpec, ...] = (
    TopicSpec("logs", "job/node (log_key)", "faultwatch.wire.logs:decode_logs", (
        Grant("agent", (W, D), "ship lines, heartbeats, notes"),
        Grant("agent", (R,), "--wait-for-nodes reads hellos"),
        Grant("processor", (R, D), "matcher stage input"),
    ), doc="line batches and lifecycle events of the agents"),
    TopicSpec("signals", "job (job_key)", "faultwatch.wire.signals:decode_signals", (
        Grant("processor", (R, W, D), "matcher -> job stage"),
    ), doc="rule hits, progress, lifecycle, heartbeats, re-keyed by job"),
    TopicSpec("decisions", "job (job_key)", "faultwatch.wire.decisions:decode_decision", (
        Grant("agent", (R, D), "follow decisions (no group)"),
        Grant("processor", (W, D), "publish decisions"),
        Grant("actuator", (R, D), "act on / notify decisions"),
    ), doc="restart, blacklist, fail, notify: signed when a key is configured"),
    TopicSpec("control", "job (job_key)", "faultwatch.wire.decisions:decode_decision", (
        Grant("agent", (R, D), "answer probes (no group)"),
        Grant("processor", (W, D), "diagnosis probes"),
        Grant("admin", (W,), "faultwatch diagnose requests (notify kind diagnose)"),
    ), doc="control traffic for the agents (diagnosis requests), keyed by job; schedulers, "
           "readers and notifiers never read it (docs/decisions.md, \"Control topic\")"),
    TopicSpec("deadletter", "the bad record's key", "faultwatch.wire.deadletter:decode_dead", (
        Grant("processor", (W, D), "undecodable records"),
    ), partitions=1, doc="records that could not be decoded, with where they came from"),
    TopicSpec("rules", "ruleset, revision/<n>", "faultwatch.wire.rules:decode_ruleset", (
        Grant("processor", (R, D), "follow pushed rule sets"),
        Grant("admin", (W,), "rules push"),
    ), partitions=1, config=COMPACT, doc="pushed rule sets and their history"),
    TopicSpec("nodes", "node (node_key)", "faultwatch.wire.tables:decode_node", (
        Grant("processor", (R, W, D), "node registry writer"),
        Grant("actuator", (R, D), "drain/resume from the registry"),
        Grant("admin", (W,), "nodes quarantine|release"),
    ), partitions=1, config=COMPACT, created="writer",
        doc="the fleet-wide node registry (compacted, key = node)"),
    TopicSpec("status", "job; worker/<host:pid>", "faultwatch.wire.tables:decode_status", (
        Grant("agent", (R, D), "a waiting hot spare leaves when its run is done (no group)"),
        Grant("processor", (W, D), "job snapshots"),
        Grant("actuator", (R, D), "notify --alertmanager: a job healthy again resolves its "
                                  "alerts"),
    ), partitions=1, config=COMPACT, doc="per-job snapshots and the workers' rule versions"),
    TopicSpec("holds", "kind/job (hold_key)", "faultwatch.wire.holds:decode_hold", (
        Grant("processor", (R, D), "operators' holds of jobs"),
        Grant("actuator", (R, D), "notify honours mutes"),
        Grant("admin", (W,), "jobs hold|mute|release|unmute"),
    ), partitions=1, config=COMPACT,
        doc="operators' holds and mutes of jobs (compacted, key = kind/job: wire/holds.py)"),
    TopicSpec("incidents", "job, run (incident_key)", "faultwatch.wire.incidents:decode_ledger", (
        Grant("processor", (R, W, D), "run ledgers (goodput); the lemon watch reads them back"),
    ), config={"cleanup.policy": "compact,delete"}, retention=True,
        doc="each job run's ledger: incidents and goodput (each run's latest)"),
    TopicSpec("acted", "decision id", "faultwatch.wire.incidents:decode_acted", (
        Grant("actuator", (W, D), "what was done, for reports"),
    ), partitions=1, config={"cleanup.policy": "delete"}, retention=True,
        doc="what actuators did for decisions (drains, taints), when"),
)
TOPIC = {t.suffix: t for t in TOPICS}


@dataclass(frozen=True)
class GroupSpec:
    """One consumer group: `template` filled with the prefix (and `{backend}` for actuate);
    `prefixed` groups are granted by prefix (every backend's)."""

    kind: str
    template: str
    grants: tuple[Grant, ...]
    prefixed: str = ""  # the granted prefix's template, when the group has variants

    def name(self, prefix: str = DEFAULT_PREFIX, **parts: str) -> str:
        return self.template.format(prefix=prefix, **parts)


GROUPS: tuple[GroupSpec, ...] = (
    GroupSpec("processor", "{prefix}processor", (
        Grant("processor", (R, D), "the workers' consumer group"),
    )),
    GroupSpec("actuate", "{prefix}actuate-{backend}", (
        Grant("actuator", (R, D), "actuate's groups <prefix>actuate-<backend>"),
    ), prefixed="{prefix}actuate-"),
    GroupSpec("notify", "faultwatch-notify", (
        Grant("actuator", (R, D), "faultwatch notify"),
    )),
)
GROUP = {g.kind: g for g in GROUPS}
NOTIFY_GROUP = GROUP["notify"].name()  # `faultwatch notify --group-id` default


def processor_group(prefix: str, app_id: str = "") -> str:
    """The processors' consumer group (= Faust app id): `--app-id`, else <prefix>processor."""
    return app_id or GROUP["processor"].name(prefix)


def actuate_group(prefix: str, backend: str) -> str:
    """`faultwatch actuate`'s consumer group: <prefix>actuate-<backend>."""
    return GROUP["actuate"].name(prefix, backend=backend)


@dataclass(frozen=True)
class Topics:
    """The names of faultwatch's topics under one prefix (one property per TOPICS row)."""

    prefix: str = DEFAULT_PREFIX

    def of(self, suffix: str) -> str:
        return TOPIC[suffix].name(self.prefix)

    @property
    def logs(self) -> str:
        return self.of("logs")

    @property
    def signals(self) -> str:
        return self.of("signals")

    @property
    def decisions(self) -> str:
        return self.of("decisions")

    @property
    def control(self) -> str:
        """Control traffic for the agents (diagnosis requests): TOPIC["control"]."""
        return self.of("control")

    @property
    def deadletter(self) -> str:
        return self.of("deadletter")

    @property
    def rules(self) -> str:
        return self.of("rules")

    @property
    def status(self) -> str:
        return self.of("status")

    @property
    def nodes(self) -> str:
        """The fleet-wide node registry (compacted, key = node)."""
        return self.of("nodes")

    @property
    def holds(self) -> str:
        """Operators' holds and mutes of jobs (compacted, key = kind/job: wire/holds.py)."""
        return self.of("holds")

    @property
    def incidents(self) -> str:
        """Each job run's ledger: incidents and goodput (compacted, key = job and run;
        written by processors, read by `faultwatch report` and the processors' lemon watch)."""
        return self.of("incidents")

    @property
    def acted(self) -> str:
        """What actuators did for decisions (drains, taints), when (written by actuators,
        read by `faultwatch report`)."""
        return self.of("acted")


def log_key(job: str, node: str) -> bytes:
    """Logs are keyed by job and node so a node's lines and lifecycle stay in order."""
    return f"{job}/{node}".encode()


def job_key(job: str) -> bytes:
    """Signals and decisions are keyed by job so one processor sees a whole job."""
    return job.encode()


def node_key(node: str) -> bytes:
    """Node records are keyed by node: the compacted topic keeps each node's latest."""
    return node.encode()


def markdown() -> str:
    """The topic table of docs/operating.md (section 3), derived from TOPICS (a test keeps
    the docs equal to it)."""
    def roles(spec: TopicSpec, ops: tuple[str, ...]) -> str:
        found = [g.role for g in spec.grants if set(g.ops) & set(ops)]
        return ", ".join(r for r in ROLES if r in found) or "—"

    lines = ["| topic | key | partitions | config | written by | read by |",
             "| --- | --- | --- | --- | --- | --- |"]
    for t in TOPICS:
        config = ", ".join(f"`{k}={v}`" for k, v in t.config.items()) or "—"
        parts = str(t.partitions) if t.partitions else "`--partitions`"
        lines.append(f"| `<prefix>{t.suffix}` | {t.key} | {parts} | {config} | "
                     f"{roles(t, (W,))} | {roles(t, (R,))} |")
    return "\n".join(lines)
