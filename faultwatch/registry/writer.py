"""The registry writer a processor holds: folds nodes-topic records in, turns its decisions
into nodes-topic records out (key, value). No I/O: the shell sends what it returns.

The processor's job stage is the registry's one automatic writer (each decision is made by
the one worker owning its job's partition; `faultwatch actuate` only reads the registry
unless `--registry-writer`); people write it with `faultwatch nodes quarantine|release`."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import orjson

from faultwatch.core.events import Decision
from faultwatch.core.registry import (
    HEALTHY,
    QUARANTINED,
    NodeRecord,
    Registry,
    RegistryPolicy,
    expire,
    registry_updates,
)
from faultwatch.errors import DecodeError
from faultwatch.eventlog import log_event
from faultwatch.trust.replay import REPLAYED
from faultwatch.trust.versions import describe, older
from faultwatch.wire import decode_node, encode_node, node_key


def encode_signed(rec: NodeRecord, signer: Any = None) -> bytes:
    """A nodes-topic record value, signed when a signer (trust.records.RecordSigner) is given."""
    if signer is None:
        return encode_node(rec)
    return orjson.dumps(signer.sign_record(orjson.loads(encode_node(rec))))


class RegistryWriter:
    """One per processor: `observe` every nodes-topic record, `updates` for its decisions,
    `quarantined(node, now)` to tell a job starting on a quarantined node at once."""

    def __init__(self, policy: RegistryPolicy | None = None, gate: Any = None,
                 signer: Any = None) -> None:
        self.policy = policy or RegistryPolicy()
        self.registry: Registry = {}
        self.caught_up = False  # set by the follower once the topic was read to its end
        self.gate = gate  # trust.records.RecordGate: refuses unsigned/forged records
        self.signer = signer  # trust.records.RecordSigner: signs the records it writes

    def observe(self, key: bytes | None, value: bytes | None, where: str = "") -> None:
        if self.gate is not None and not self.gate.admit_value(value, where=where):
            return
        if value is None:
            if key is not None:
                self.registry.pop(key.decode(errors="replace"), None)
            return
        try:
            rec = decode_node(value)
        except DecodeError as e:
            log_event("undecodable_record", where=where, error=str(e))
            return
        held = self.registry.get(rec.node)
        if self.gate is not None and self.gate.verifying and held is not None and older(
                held.version, rec.version):
            self.gate.refuse(REPLAYED, f"node {rec.node!r}: {describe(rec.version)} after "
                             f"{describe(held.version)} (an old record written again)",
                             where=where)
            return
        self.registry[rec.node] = rec

    def updates(self, decisions: Iterable[Decision], now: float
                ) -> list[tuple[bytes, bytes]]:
        """Nodes-topic records (key, value) for blacklists and suspects in `decisions`."""
        out: list[tuple[bytes, bytes]] = []
        for dec in decisions:
            for rec in registry_updates(dec, self.registry, now, self.policy):
                self.registry[rec.node] = rec
                out.append((node_key(rec.node), encode_signed(rec, self.signer)))
        return out

    def state(self, node: str, now: float) -> str:
        """The node's registry state now (healthy, suspect or quarantined)."""
        rec = self.registry.get(node)
        return HEALTHY if rec is None else expire(rec, now, self.policy).state

    def quarantined(self, node: str, now: float) -> NodeRecord | None:
        rec = self.registry.get(node)
        if rec is None:
            return None
        rec = expire(rec, now, self.policy)
        return rec if rec.state == QUARANTINED else None
