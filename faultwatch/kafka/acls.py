"""Who may do what on Kafka: one principal per role and the ACLs each role needs (pure).

Roles: `agent` (the node side: ships logs, follows decisions), `processor` (Faust workers:
decide, publish status and registry changes, follow holds), `actuator` (`faultwatch actuate`
and `faultwatch notify`: read decisions, the registry and mutes, act outside Kafka), `admin`
(operators: topics, ACLs, `rules push|rollback`, `nodes quarantine|release`, `jobs
hold|mute|release|unmute`, `diagnose`). Everything not granted is denied (the broker runs
with `allow.everyone.if.no.acl.found=false`). docs/operating.md holds the same table for
people; `table()` is what `faultwatch kafka acls` prints and applies.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from faultwatch.errors import UsageError

ROLES = ("agent", "processor", "actuator", "admin")
DEFAULT_PRINCIPALS = {role: f"User:faultwatch-{role}" for role in ROLES}
NOTIFY_GROUP = "faultwatch-notify"  # `faultwatch notify --group-id` default
CLUSTER = "kafka-cluster"  # the one name of the cluster resource

# Kafka protocol codes (org.apache.kafka.common.acl / resource enums).
RESOURCE_TYPES = {"topic": 2, "group": 3, "cluster": 4, "transactional_id": 5}
PATTERNS = {"literal": 3, "prefixed": 4}
OPERATIONS = {"all": 2, "read": 3, "write": 4, "create": 5, "delete": 6, "alter": 7,
              "describe": 8, "cluster_action": 9, "describe_configs": 10,
              "alter_configs": 11, "idempotent_write": 12}
PERMISSIONS = {"deny": 2, "allow": 3}


@dataclass(frozen=True, order=True)
class Acl:
    """One ACL binding: `principal` may (`permission`) do `operation` on a resource."""

    principal: str
    resource_type: str
    name: str
    pattern: str
    operation: str
    permission: str = "allow"
    host: str = "*"
    why: str = field(default="", compare=False)

    def key(self) -> tuple[int, str, int, str, str, int, int]:
        """The binding as the broker reports it (protocol codes), for comparing."""
        return (_code(RESOURCE_TYPES, self.resource_type), self.name,
                _code(PATTERNS, self.pattern), self.principal, self.host,
                _code(OPERATIONS, self.operation), _code(PERMISSIONS, self.permission))

    def line(self) -> str:
        """`User:faultwatch-agent allow write topic faultwatch.logs (literal)  # why`."""
        text = (f"{self.principal} {self.permission} {self.operation} {self.resource_type} "
                f"{self.name} ({self.pattern})")
        return f"{text}  # {self.why}" if self.why else text

    def as_dict(self) -> dict[str, str]:
        return {"principal": self.principal, "permission": self.permission,
                "operation": self.operation, "resource_type": self.resource_type,
                "name": self.name, "pattern": self.pattern, "host": self.host, "why": self.why}


def _principal(text: str) -> str:
    kind, sep, name = text.partition(":")
    if not sep or not kind or not name or any(c.isspace() for c in text):
        raise UsageError(f"a principal is TYPE:NAME without spaces, e.g. User:faultwatch-agent; "
                         f"got {text!r}")
    return text


def principals(overrides: Mapping[str, str] | None = None) -> dict[str, str]:
    """Role -> principal: `User:faultwatch-<role>` unless overridden (`role=User:name`)."""
    out = dict(DEFAULT_PRINCIPALS)
    for role, principal in (overrides or {}).items():
        if role not in ROLES:
            raise UsageError(f"unknown role {role!r}; roles: {', '.join(ROLES)}")
        out[role] = _principal(principal)
    if len(set(out.values())) != len(out):
        raise UsageError("each role needs its own principal (one principal per role)")
    return out


def parse_principal_flags(values: Iterable[str]) -> dict[str, str]:
    """`--principal ROLE=TYPE:NAME` values -> {role: principal}."""
    out: dict[str, str] = {}
    for value in values:
        role, sep, principal = value.partition("=")
        if not sep:
            raise UsageError(f"--principal takes ROLE=TYPE:NAME (e.g. agent=User:fw-agent); "
                             f"got {value!r}")
        out[role.strip()] = principal.strip()
    return out


@dataclass(frozen=True)
class Scope:
    """The names one faultwatch installation uses on a cluster."""

    prefix: str = "faultwatch."
    app_id: str = ""  # the processors' Faust app id (= consumer group); default <prefix>processor
    notify_group: str = NOTIFY_GROUP

    def __post_init__(self) -> None:
        if not self.prefix:
            raise UsageError("the topic prefix may not be empty (ACLs on a prefix of '' would "
                             "cover every topic of the cluster)")
        for name in (self.prefix, self.app_id, self.notify_group):
            if any(c.isspace() for c in name):
                raise UsageError(f"{name!r}: topic prefixes and group names take no spaces")

    @property
    def app(self) -> str:
        return self.app_id or f"{self.prefix}processor"

    def topic(self, name: str) -> str:
        return f"{self.prefix}{name}"


def _grants(p: str, rtype: str, name: str, ops: Iterable[str], why: str,
            pattern: str = "literal") -> list[Acl]:
    return [Acl(p, rtype, name, pattern, op, why=why) for op in ops]


def role_acls(role: str, scope: Scope, principal: str) -> list[Acl]:
    """The ACLs of one role (see the module docstring and docs/operating.md section 3)."""
    t = scope.topic
    R, W, D = "read", "write", "describe"
    g: list[Acl] = []
    if role == "agent":
        g += _grants(principal, "topic", t("logs"), (W, D), "ship lines, heartbeats, notes")
        g += _grants(principal, "topic", t("logs"), (R,), "--wait-for-nodes reads hellos")
        g += _grants(principal, "topic", t("decisions"), (R, D), "follow decisions (no group)")
        g += _grants(principal, "topic", t("control"), (R, D), "answer probes (no group)")
        g += _grants(principal, "topic", t("status"), (R, D),
                     "a waiting hot spare leaves when its run is done (no group)")
    elif role == "processor":
        g += _grants(principal, "topic", t("logs"), (R, D), "matcher stage input")
        g += _grants(principal, "topic", t("signals"), (R, W, D), "matcher -> job stage")
        g += _grants(principal, "topic", t("decisions"), (W, D), "publish decisions")
        g += _grants(principal, "topic", t("control"), (W, D), "diagnosis probes")
        g += _grants(principal, "topic", t("deadletter"), (W, D), "undecodable records")
        g += _grants(principal, "topic", t("rules"), (R, D), "follow pushed rule sets")
        g += _grants(principal, "topic", t("nodes"), (R, W, D), "node registry writer")
        g += _grants(principal, "topic", t("status"), (W, D), "job snapshots")
        g += _grants(principal, "topic", t("incidents"), (R, W, D),
                     "run ledgers (goodput); the lemon watch reads them back")
        g += _grants(principal, "topic", t("holds"), (R, D), "operators' holds of jobs")
        g += _grants(principal, "topic", f"{scope.app}-",
                     (R, W, D, "create", "describe_configs"),
                     "Faust changelog, repartition and assignor topics", "prefixed")
        g += _grants(principal, "group", scope.app, (R, D), "the workers' consumer group")
    elif role == "actuator":
        g += _grants(principal, "topic", t("decisions"), (R, D), "act on / notify decisions")
        g += _grants(principal, "topic", t("nodes"), (R, D), "drain/resume from the registry")
        g += _grants(principal, "topic", t("status"), (R, D),
                     "notify --alertmanager: a job healthy again resolves its alerts")
        g += _grants(principal, "topic", t("acted"), (W, D), "what was done, for reports")
        g += _grants(principal, "group", t("actuate-"), (R, D),
                     "actuate's groups <prefix>actuate-<backend>", "prefixed")
        g += _grants(principal, "group", scope.notify_group, (R, D), "faultwatch notify")
        g += _grants(principal, "topic", t("holds"), (R, D), "notify honours mutes")
    elif role == "admin":
        g += _grants(principal, "topic", scope.prefix,
                     (R, D, "create", "delete", "alter", "describe_configs", "alter_configs"),
                     "create topics, read everything", "prefixed")
        g += _grants(principal, "topic", t("rules"), (W,), "rules push")
        g += _grants(principal, "topic", t("nodes"), (W,), "nodes quarantine|release")
        g += _grants(principal, "topic", t("holds"), (W,), "jobs hold|mute|release|unmute")
        g += _grants(principal, "topic", t("control"), (W,),
                     "faultwatch diagnose requests (notify kind diagnose)")
        g += _grants(principal, "group", scope.prefix, (D, "delete"),
                     "inspect and reset consumer groups", "prefixed")
        g += _grants(principal, "cluster", CLUSTER, ("alter", D),
                     "manage ACLs (faultwatch kafka acls --apply)")
    else:
        raise UsageError(f"unknown role {role!r}; roles: {', '.join(ROLES)}")
    return g


def table(scope: Scope, who: Mapping[str, str] | None = None) -> list[Acl]:
    """Every role's ACLs for `scope`, in role order (`who`: role -> principal overrides)."""
    names = principals(who)
    return [acl for role in ROLES for acl in role_acls(role, scope, names[role])]


def in_scope(acl: Acl, scope: Scope) -> bool:
    """Whether `acl` is about this installation's resources: its topics and groups (by
    prefix, app id or notify group) or the cluster. Another prefix's ACLs are not."""
    if acl.resource_type == "cluster":
        return True
    return (acl.name.startswith((scope.prefix, scope.app)) or acl.name == scope.notify_group
            or (acl.pattern == "prefixed" and scope.prefix.startswith(acl.name)))


def extra(found: Iterable[Acl], wanted: Iterable[Acl], scope: Scope) -> list[Acl]:
    """ACLs the broker holds for the roles' principals on `scope`'s resources beyond
    `wanted`: a widened ACL (a prefixed grant covering the prefix counts too)."""
    want = {a.key() for a in wanted}
    mine = {a.principal for a in wanted}
    return sorted(a for a in found
                  if a.principal in mine and a.key() not in want and in_scope(a, scope))


def _code(codes: Mapping[str, int], name: str) -> int:
    return codes[name] if name in codes else int(name.removeprefix("code"))


def _name(codes: Mapping[str, int], code: int) -> str:
    return next((k for k, v in codes.items() if v == code), f"code{code}")


def from_codes(rtype: int, name: str, pattern: int, principal: str, host: str, op: int,
               perm: int) -> Acl:
    """An ACL as the broker reported it (protocol codes; kinds this table never uses are
    named `code<N>`)."""
    return Acl(principal, _name(RESOURCE_TYPES, rtype), name, _name(PATTERNS, pattern),
               _name(OPERATIONS, op), _name(PERMISSIONS, perm), host)


_OP_ORDER = ("read", "write", "describe", "create", "delete", "alter", "describe_configs",
             "alter_configs", "all")
_ROLE_HEADS = {"agent": "agent", "processor": "processor", "actuator": "actuator / notify",
               "admin": "admin"}


def markdown(scope: Scope) -> str:
    """The role table of docs/operating.md for `scope`: one row per resource, one column per
    role, the operations each role may do (a test keeps the docs equal to this)."""
    names = principals()
    role_of = {p: r for r, p in names.items()}
    rows: dict[tuple[str, str, str], dict[str, set[str]]] = {}
    for a in table(scope):
        cell = rows.setdefault((a.resource_type, a.pattern, a.name), {})
        cell.setdefault(role_of[a.principal], set()).add(a.operation)

    def label(rtype: str, pattern: str, name: str) -> str:
        if rtype == "cluster":
            return "cluster"
        return f"{rtype} {'prefix ' if pattern == 'prefixed' else ''}`{name}`"

    def ops(found: set[str]) -> str:
        return ", ".join(o.replace("_", " ").title().replace(" ", "")
                         for o in _OP_ORDER if o in found) or "—"

    head = "| resource | " + " | ".join(_ROLE_HEADS[r] for r in ROLES) + " |"
    lines = [head, "|" + " --- |" * (len(ROLES) + 1)]
    order = {"topic": 0, "group": 1, "cluster": 2}
    for key in sorted(rows, key=lambda k: (order[k[0]], k[2], k[1])):
        lines.append(f"| {label(*key)} | "
                     + " | ".join(ops(rows[key].get(r, set())) for r in ROLES) + " |")
    return "\n".join(lines)
