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
from faultwatch.wire.topics import (  # noqa: F401 - NOTIFY_GROUP re-exported
    DEFAULT_PREFIX,
    GROUP,
    GROUPS,
    NOTIFY_GROUP,
    ROLES,
    TOPIC,
    TOPICS,
    D,
    R,
    W,
    processor_group,
)

DEFAULT_PRINCIPALS = {role: f"User:faultwatch-{role}" for role in ROLES}
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

    prefix: str = DEFAULT_PREFIX
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
        return processor_group(self.prefix, self.app_id)

    def topic(self, name: str) -> str:
        return TOPIC[name].name(self.prefix)

    def group(self, kind: str) -> tuple[str, str]:
        """(name, pattern) of a GROUPS row as granted here: the processors' under
        --app-id, notify's under --notify-group, actuate's by prefix (every backend)."""
        if kind == "processor":
            return self.app, "literal"
        if kind == "notify":
            return self.notify_group, "literal"
        spec = GROUP[kind]
        if spec.prefixed:
            return spec.prefixed.format(prefix=self.prefix), "prefixed"
        return spec.name(self.prefix), "literal"


def _grants(p: str, rtype: str, name: str, ops: Iterable[str], why: str,
            pattern: str = "literal") -> list[Acl]:
    return [Acl(p, rtype, name, pattern, op, why=why) for op in ops]


def role_acls(role: str, scope: Scope, principal: str) -> list[Acl]:
    """The ACLs of one role: its grants on each topic and group of the one table
    (wire/topics.TOPICS, GROUPS), then the installation-wide ones of the role below (see the
    module docstring and docs/operating.md section 3)."""
    if role not in ROLES:
        raise UsageError(f"unknown role {role!r}; roles: {', '.join(ROLES)}")
    g: list[Acl] = []
    if role == "admin":  # before the per-topic writes: reading and managing every topic
        g += _grants(principal, "topic", scope.prefix,
                     (R, D, "create", "delete", "alter", "describe_configs", "alter_configs"),
                     "create topics, read everything", "prefixed")
    for spec in TOPICS:
        for grant in spec.grants:
            if grant.role == role:
                g += _grants(principal, "topic", scope.topic(spec.suffix), grant.ops,
                             grant.why)
    if role == "processor":  # Faust's own topics: named after the app id
        g += _grants(principal, "topic", f"{scope.app}-",
                     (R, W, D, "create", "describe_configs"),
                     "Faust changelog, repartition and assignor topics", "prefixed")
    for group in GROUPS:
        for grant in group.grants:
            if grant.role == role:
                name, pattern = scope.group(group.kind)
                g += _grants(principal, "group", name, grant.ops, grant.why, pattern)
    if role == "admin":
        g += _grants(principal, "group", scope.prefix, (D, "delete"),
                     "inspect and reset consumer groups", "prefixed")
        g += _grants(principal, "cluster", CLUSTER, ("alter", D),
                     "manage ACLs (faultwatch kafka acls --apply)")
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
