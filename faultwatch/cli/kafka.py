"""`faultwatch kafka up|down|status|acls|fetch`: a local single-node Kafka broker without Docker
(`up --secure`: SASL_SSL and ACLs), and the role ACLs of a prefix."""

from __future__ import annotations

import argparse
import asyncio
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

from faultwatch.cli import options
from faultwatch.errors import EXIT_ERROR, EXIT_OK, BrokerError
from faultwatch.kafka import acls
from faultwatch.kafka import settings as kafka_settings


def _broker_errors(exc: OSError) -> BrokerError:
    return BrokerError(f"{type(exc).__name__}: {exc}")


def cmd_kafka_up(args: argparse.Namespace) -> int:
    from faultwatch.kafka import broker as kafka_local

    if args.secure:
        return cmd_up_secure(args)
    try:
        print(kafka_local.up(args.port, args.data_dir, args.controller_port), flush=True)
    except OSError as e:
        raise _broker_errors(e) from e
    return EXIT_OK


def cmd_kafka_down(args: argparse.Namespace) -> int:
    from faultwatch.kafka import broker as kafka_local

    try:
        data = kafka_local.locate(args.data_dir, args.port)
        stopped = kafka_local.down(data, args.port)
    except OSError as e:
        raise _broker_errors(e) from e
    print(f"stopped the broker of {data}" if stopped else f"no broker running for {data}")
    return EXIT_OK


def cmd_kafka_status(args: argparse.Namespace) -> int:
    from faultwatch.kafka import broker as kafka_local

    try:
        info = kafka_local.status(args.data_dir, args.port)
    except OSError as e:
        raise _broker_errors(e) from e
    if args.json:
        print(json.dumps(info))
    elif info["running"]:
        print(f"running: pid {info['pid']}, bootstrap {info['bootstrap']}, "
              f"data dir {info['data_dir']}")
    elif info["listening"]:
        print(f"listening: 127.0.0.1:{args.port} accepts connections, a broker faultwatch "
              f"did not start (no broker of data dir {info['data_dir']})")
    else:
        print(f"not running: nothing listens on 127.0.0.1:{args.port} (data dir "
              f"{info['data_dir']})")
    return EXIT_OK if info["running"] or info["listening"] else EXIT_ERROR


def cmd_kafka_acls(args: argparse.Namespace) -> int:
    return cmd_acls(args, options.need_bootstrap)


def cmd_kafka_fetch(args: argparse.Namespace) -> int:
    from faultwatch.kafka import jars

    try:
        print(jars.ensure_jars())
    except OSError as e:
        raise _broker_errors(e) from e
    return EXIT_OK


def add_scope_flags(p: argparse.ArgumentParser, *, prefix: bool) -> None:
    """--app-id and --notify-group (and --topic-prefix where the caller has none)."""
    if prefix:
        options.add_topic_prefix(p)
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
    options.add_json(p, "print one JSON object per ACL")
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
    from faultwatch.kafka.admin import ensure_all
    from faultwatch.wire.topics import DEFAULT_PARTITIONS, Topics

    bootstrap = need_bootstrap(args)
    security = kafka_settings.current()

    async def topics() -> None:
        await ensure_all(bootstrap, Topics(scope.prefix), args.partitions or DEFAULT_PARTITIONS,
                         security=security)

    async def run() -> acl_admin.ApplyResult:
        # the ACLs first: on a new prefix the admin role may create its topics only once
        # its own grants exist (the other order created no topic on the first run)
        result = await acl_admin.apply(bootstrap, security, scope, wanted)
        await acl_admin.retry_unauthorized(topics)
        return result

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


def register(sub: Any) -> None:
    from faultwatch.kafka.jars import CACHE_ENV, KAFKA_VERSION

    kafka = sub.add_parser(
        "kafka", help="run a local single-node Kafka broker without Docker",
        description=f"Run Apache Kafka {KAFKA_VERSION} (KRaft) from Maven Central jars "
                    f"(cached in ${CACHE_ENV} or ~/.cache/faultwatch/kafka-{KAFKA_VERSION}).")
    actions = options.subcommands(kafka, "kafka_command", required=True, metavar="ACTION")
    start = actions.add_parser("up", help="start the broker; print its bootstrap address")
    stop = actions.add_parser("down", help="stop the broker of a data directory")
    show = actions.add_parser("status", help="show whether the broker runs")
    for p in (start, stop, show):
        p.add_argument("--port", type=int, default=9092, help="broker port (default 9092)")
        p.add_argument("--data-dir", type=Path, default=None,
                       help="broker data directory (default ~/.cache/faultwatch/broker-PORT)")
    start.add_argument("--controller-port", type=int, default=None,
                       help="KRaft controller port (default: previous one, else a free one)")
    start.add_argument("--secure", action="store_true",
                       help="no unauthenticated listener: SASL_SSL (SCRAM-SHA-512) on --port, "
                            "ACLs, one principal per role; writes DATA_DIR/clients/<role>.yaml")
    start.add_argument("--partitions", type=int, default=None,
                       help="with --secure: partitions of the topics it creates")
    add_scope_flags(start, prefix=True)
    acl = actions.add_parser("acls", help="print (--apply: create) the role ACLs of a prefix")
    options.add_kafka(acl)
    add_acls_flags(acl)
    acl.set_defaults(func=cmd_kafka_acls)
    options.add_json(show, "print JSON")
    fetch = actions.add_parser("fetch", help="resolve the broker jars from Maven Central (once)")
    start.set_defaults(func=cmd_kafka_up)
    stop.set_defaults(func=cmd_kafka_down)
    show.set_defaults(func=cmd_kafka_status)
    fetch.set_defaults(func=cmd_kafka_fetch)
