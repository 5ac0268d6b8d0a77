"""`faultwatch kafka up|down|status|acls|fetch`: a local single-node Kafka broker without Docker
(`up --secure`: SASL_SSL and ACLs), and the role ACLs of a prefix."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from faultwatch.cli import options
from faultwatch.errors import EXIT_OK, BrokerError


def _broker_errors(exc: OSError) -> BrokerError:
    return BrokerError(f"{type(exc).__name__}: {exc}")


def cmd_kafka_up(args: argparse.Namespace) -> int:
    from faultwatch.kafka import broker as kafka_local

    if args.secure:
        from faultwatch.kafka.cli import cmd_up_secure

        return cmd_up_secure(args)
    try:
        print(kafka_local.up(args.port, args.data_dir, args.controller_port), flush=True)
    except OSError as e:
        raise _broker_errors(e) from e
    return EXIT_OK


def cmd_kafka_down(args: argparse.Namespace) -> int:
    from faultwatch.kafka import broker as kafka_local

    try:
        data = kafka_local.status(args.data_dir, args.port)["data_dir"]
        stopped = kafka_local.down(args.data_dir, args.port)
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
    else:
        print(f"not running (data dir {info['data_dir']})")
    return EXIT_OK


def cmd_kafka_acls(args: argparse.Namespace) -> int:
    from faultwatch.kafka.cli import cmd_acls

    return cmd_acls(args, options.need_bootstrap)


def cmd_kafka_fetch(args: argparse.Namespace) -> int:
    from faultwatch.kafka import broker as kafka_local

    try:
        print(kafka_local.ensure_jars())
    except OSError as e:
        raise _broker_errors(e) from e
    return EXIT_OK


def register(sub: Any) -> None:
    from faultwatch.kafka.broker import CACHE_ENV, KAFKA_VERSION

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
    from faultwatch.kafka.cli import add_acls_flags, add_scope_flags

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
