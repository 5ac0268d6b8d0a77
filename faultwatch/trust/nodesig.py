"""Node signatures on logs-topic records: an agent speaks only for its own node.

The agent signs each record's value bytes as sent (no re-encoding) with its node key and puts
the signature in two Kafka headers, `fw-kid` (the key id) and `fw-sig` (64 raw bytes). The
matcher verifies the bytes it consumed and checks that the key belongs to the node the record
names (the trust file's `node` line for that key). Signing happens on the shipper's delivery
thread, never on the path that reads the child's output.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

from faultwatch.errors import DecodeError
from faultwatch.trust.keys import NODE, SigningKey, TrustSet
from faultwatch.trust.records import WRONG_ROLE
from faultwatch.trust.refusals import note_refusal
from faultwatch.wire.signing import BAD_SIGNATURE, MALFORMED, UNKNOWN_KEY, UNSIGNED

HEADER_KID, HEADER_SIG = "fw-kid", "fw-sig"
CONTEXT = b"faultwatch/logs/v1\0"
WRONG_NODE = "wrong_node"

Headers = Sequence[tuple[str, bytes]]


class RefusedRecord(DecodeError):
    """A logs record whose node signature does not hold (dead-lettered with the reason)."""

    def __init__(self, reason: str, detail: str) -> None:
        super().__init__(f"refused ({reason}): {detail}")
        self.reason, self.detail = reason, detail
        # (job, node, attempt, run id) of the refused record, set by the matcher: the
        # processor tells that agent why (streams/refusal_notices.py)
        self.about: tuple[str, str, int, str] | None = None


class NodeSigner:
    """The agent's side: headers for a record value."""

    def __init__(self, key: SigningKey) -> None:
        self.key = key
        self._kid = key.key_id.encode()

    def headers(self, value: bytes) -> list[tuple[str, bytes]]:
        return [(HEADER_KID, self._kid), (HEADER_SIG, self.key.sign(CONTEXT + value))]


def header_pairs(raw: Any) -> tuple[tuple[str, bytes], ...]:
    """Kafka headers (a list of pairs or a mapping, as aiokafka and Faust give them)."""
    if not raw:
        return ()
    items: Iterable[Any] = raw.items() if hasattr(raw, "items") else raw
    out = []
    for pair in items:
        try:
            k, v = pair
        except (TypeError, ValueError):
            continue
        if isinstance(k, bytes):
            k = k.decode(errors="replace")
        if isinstance(k, str) and isinstance(v, bytes | None):
            out.append((k, v or b""))
    return tuple(out)


class NodeVerifier:
    """The processor's side: `check(node, value, headers)` raises RefusedRecord unless the
    record was signed by a trusted key of `node`."""

    def __init__(self, trust: TrustSet) -> None:
        self.by_id = {k.key_id: k for k in trust.of_role(NODE)}
        self.others = {k.key_id: k.role for k in trust.keys if k.role != NODE}
        self.checked = 0

    def check(self, node: str, value: bytes, headers: Headers) -> str:
        """The key id that signed the record; RefusedRecord (counted) when it does not hold."""
        self.checked += 1
        kid = sig = None
        for k, v in headers:
            if k == HEADER_KID:
                kid = v
            elif k == HEADER_SIG:
                sig = v
        if kid is None or sig is None:
            self._refuse(UNSIGNED, f"no node signature on a record of node {node!r}")
        key_id = (kid or b"").decode(errors="replace")[:64]
        key = self.by_id.get(key_id)
        if key is None:
            if key_id in self.others:
                self._refuse(WRONG_ROLE, f"key {key_id} is a {self.others[key_id]} key, not a "
                                         "node key")
            self._refuse(UNKNOWN_KEY, f"key {key_id!r} is not a node key in the trust file")
        assert key is not None and sig is not None
        if len(sig) != 64:
            self._refuse(MALFORMED, "fw-sig must be 64 bytes")
        if key.name != node:
            self._refuse(WRONG_NODE, f"the record names node {node!r} but is signed by "
                                     f"{key.name!r}'s key {key_id}")
        if not key.verify(sig, CONTEXT + value):
            self._refuse(BAD_SIGNATURE, f"the signature of node {node!r} does not match the "
                                        "record (forged or altered)")
        return key_id

    @staticmethod
    def _refuse(reason: str, detail: str) -> None:
        note_refusal("logs", reason, detail)
        raise RefusedRecord(reason, detail)
