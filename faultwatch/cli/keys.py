"""`faultwatch keys generate|show`: make and inspect Ed25519 key pairs and trust files."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from faultwatch.cli import options
from faultwatch.errors import ConfigError
from faultwatch.trust.keys import (
    NODE,
    OPERATOR,
    PROCESSOR,
    PublicKey,
    describe,
    generate,
    parse_trust,
    read_signing_key,
)

EXIT_OK = 0


def cmd_generate(args: argparse.Namespace) -> int:
    role = NODE if args.node else args.role
    if role is None:
        raise ConfigError("keys generate", "give --role processor|operator or --node NODE")
    if args.node and args.role not in (None, NODE):
        raise ConfigError("--node", f"a node key has role node, not {args.role}")
    name = args.node or args.name or ""
    out = args.out or Path(f"faultwatch-{role}{'-' + name if name else ''}.key")
    pub = generate(out, role, name)
    print(f"wrote {out} (private, mode 600) and {out}.pub")
    print(f"key_id={pub.key_id} fingerprint={pub.fingerprint}")
    print("add this line to the trust file of every consumer:")
    print(pub.line())
    return EXIT_OK


def cmd_show(args: argparse.Namespace) -> int:
    path: Path = args.file
    try:
        head = path.read_bytes()[:64]
    except OSError as e:
        raise ConfigError(str(path), f"cannot read: {e.strerror or e}") from None
    if head.startswith(b"-----BEGIN"):
        key = read_signing_key(path)  # the private key: only its public half is printed
        pub = PublicKey(NODE if args.node else args.role, key.public_raw, args.node or "")
        print(f"private key {path}: key_id={key.key_id} fingerprint={pub.fingerprint}")
        print(pub.line())
        return EXIT_OK
    trust = parse_trust(path.read_text(errors="replace"), str(path))
    for line in describe(trust.keys):
        print(line)
    return EXIT_OK


def register(sub: Any) -> argparse.ArgumentParser:
    p: argparse.ArgumentParser = sub.add_parser(
        "keys", help="make and show Ed25519 keys (processor, operator, node) and trust files",
        description="Ed25519 key pairs for signed decisions, rule sets, registry records and "
                    "node identity. See docs/operating.md, 'Keys and trust'.")
    ksub = options.subcommands(p, "keys_command", metavar="SUBCOMMAND", required=True)
    g = ksub.add_parser("generate", help="write a new private key (0600) and its .pub line")
    g.add_argument("--role", choices=(PROCESSOR, OPERATOR, NODE), default=None)
    g.add_argument("--node", default=None, metavar="NODE",
                   help="a node key for NODE (role node): the agent on NODE signs with it")
    g.add_argument("--name", default=None, help="a label for a processor/operator key")
    g.add_argument("--out", type=Path, default=None,
                   help="private key file (default faultwatch-<role>[-<name>].key); never "
                        "overwritten")
    g.set_defaults(func=cmd_generate)
    s = ksub.add_parser("show", help="key id, fingerprint and trust line of a private key "
                                     "file, or every key of a trust file")
    s.add_argument("file", type=Path)
    s.add_argument("--role", choices=(PROCESSOR, OPERATOR, NODE), default=PROCESSOR,
                   help="the role to print in a private key's trust line")
    s.add_argument("--node", default=None, help="the node name for a node key's trust line")
    s.set_defaults(func=cmd_show)
    return p
