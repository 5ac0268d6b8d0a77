"""`faultwatch kafka up --secure` and `faultwatch kafka acls`: their flags and commands."""

from __future__ import annotations

import argparse
import asyncio
import json
from collections.abc import Callable

from faultwatch.errors import EXIT_OK, BrokerError
from faultwatch.kafka import acls
from faultwatch.kafka import settings as kafka_settings


def add_scope_flags(p: argparse.ArgumentParser, *, prefix: bool) -> None:
    """--app-id and --notify-group (and --topic-prefix where the caller has none)."""
    if prefix:
        p.add_argument("--topic-prefix", default="faultwatch.",
                       help="topic name prefix (default 'faultwatch.')")
    p.add_argument("--app-id", default="",
                   help="the processors' Faust app id = consumer group (default "
                        "<prefix>processor, as `faultwatch process`)")
    p.add_argument("--notify-group", default=acls.NOTIFY_GROUP,
                   help=f"`faultwatch notify --group-id` (default {acls.NOTIFY_GROUP})")


def add_acls_flags(p: argparse.ArgumentParser) -> None:
    """The flags of `faultwatch kafka acls` (beside --bootstrap/--topic-prefix/--kafka-*)."""
    add_scope_flags(p, prefix=False)
    p.add_argument("--principal", action="append", default=[], metavar="ROLE=TYPE:NAME",
                   help="the principal of a role (repeatable; default User:faultwatch-<role>; "
                        f"roles: {', '.join(acls.ROLES)})")
    p.add_argument("--json", action="store_true", help="print one JSON object per ACL")
    p.add_argument("--apply", action="store_true",
                   help="create the missing topics and ACLs on --bootstrap (idempotent; needs "
                        "a principal allowed to alter the cluster, e.g. the admin role)")
    p.add_argument("--partitions", type=int, default=None,
                   help="partitions of logs/signals/decisions when --apply creates them "
                        "(default as `faultwatch process`)")


def scope_of(args: argparse.Namespace) -> acls.Scope:
    return acls.Scope(prefix=args.topic_prefix, app_id=args.app_id,
                      notify_group=args.notify_group)


def cmd_acls(args: argparse.Namespace, need_bootstrap: Callable[[argparse.Namespace], str],
             out: Callable[[str], None] = print) -> int:
    """Print the role ACLs of a prefix; with --apply, create them (and the topics)."""
    scope = scope_of(args)
    wanted = acls.table(scope, acls.parse_principal_flags(args.principal))
    for a in wanted:
        out(json.dumps(a.as_dict(), sort_keys=True) if args.json else a.line())
    if not args.apply:
        return EXIT_OK
    from faultwatch.kafka import acl_admin
    from faultwatch.kafka.admin import ensure_compacted_topic, ensure_topics
    from faultwatch.wire.topics import DEFAULT_PARTITIONS, Topics

    bootstrap = need_bootstrap(args)
    security = kafka_settings.current()

    async def run() -> acl_admin.ApplyResult:
        await ensure_topics(bootstrap, Topics(scope.prefix),
                            args.partitions or DEFAULT_PARTITIONS, security=security)
        await ensure_compacted_topic(bootstrap, scope.topic("nodes"), security=security)
        return await acl_admin.apply(bootstrap, security, scope, wanted)

    result = asyncio.run(run())
    for a in result.extra:
        out(f"warning: {a.principal} holds an ACL beyond the role table: {a.line()}")
    out(f"applied: {len(result.created)} created, {len(result.present)} already present, "
        f"{len(result.extra)} extra on {bootstrap}")
    return EXIT_OK


def cmd_up_secure(args: argparse.Namespace, out: Callable[[str], None] = print) -> int:
    """`kafka up --secure`: the client files first, the SASL_SSL bootstrap as the last line."""
    from faultwatch.kafka import secure_broker

    try:
        broker = secure_broker.up(args.port, args.data_dir, args.controller_port,
                                  scope_of(args), args.partitions)
    except OSError as e:
        raise BrokerError(f"{type(e).__name__}: {e}") from e
    out(f"data dir: {broker.data_dir}")
    for role, path in broker.clients.items():
        out(f"{role}: --kafka-config {path}")
    out(f"CA: {broker.ca_file}")
    out(broker.bootstrap)
    return EXIT_OK
