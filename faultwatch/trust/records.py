"""Ed25519 signatures on JSON records (decisions, rule sets, node-registry records).

The signed bytes are `faultwatch/<purpose>/v1` NUL the record's canonical JSON (sorted keys,
compact, without the `signature` field), so a signature made for one purpose never verifies
as another. The record carries `"signature": {"alg": "Ed25519", "key_id": "<16 hex>",
"sig": "<base64>"}`. Who may sign which purpose:

| purpose    | record                          | signer roles          |
| ---------- | ------------------------------- | --------------------- |
| `decision` | `<prefix>decisions`             | processor (operator: `notify` only) |
| `rules`    | `<prefix>rules`                 | operator              |
| `node`     | `<prefix>nodes` (the registry)  | processor, operator   |
| `ledger`   | `<prefix>incidents`             | processor             |
| `hold`     | `<prefix>holds` (job holds, mutes) | operator           |
"""

from __future__ import annotations

import base64
import binascii
from collections.abc import Callable, Mapping
from typing import Any

import orjson

from faultwatch import settings
from faultwatch.trust.keys import ALG, NODE, OPERATOR, PROCESSOR, SigningKey, TrustSet
from faultwatch.trust.refusals import REFUSALS, note_refusal
from faultwatch.wire import signing
from faultwatch.wire.signing import (
    BAD_SIGNATURE,
    MALFORMED,
    SIGNATURE_FIELD,
    SIGNED,
    UNKNOWN_KEY,
    UNSIGNED,
    Verdict,
    canonical,
)

WRONG_ROLE = "wrong_role"
DECISION, RULES, NODE_RECORD, HOLD, LEDGER = "decision", "rules", "node", "hold", "ledger"
SIGNERS: dict[str, tuple[str, ...]] = {DECISION: (PROCESSOR,), RULES: (OPERATOR,),
                                       NODE_RECORD: (PROCESSOR, OPERATOR), HOLD: (OPERATOR,),
                                       LEDGER: (PROCESSOR,)}



def signed_bytes(purpose: str, record: Mapping[str, Any]) -> bytes:
    return f"faultwatch/{purpose}/v1".encode() + b"\0" + canonical(record)


class RecordSigner:
    """Signs records of one purpose with a private key (the processor's or an operator's)."""

    def __init__(self, key: SigningKey, purpose: str) -> None:
        self.key, self.purpose = key, purpose

    @property
    def key_id(self) -> str:
        return self.key.key_id

    def sign_record(self, record: Mapping[str, Any]) -> dict[str, Any]:
        out = {k: v for k, v in record.items() if k != SIGNATURE_FIELD}
        sig = self.key.sign(signed_bytes(self.purpose, out))
        out[SIGNATURE_FIELD] = {"alg": ALG, "key_id": self.key.key_id,
                                "sig": base64.b64encode(sig).decode()}
        return out


class RecordVerifier:
    """Checks records of one purpose against the trusted keys of the roles that may sign it."""

    def __init__(self, trust: TrustSet, purpose: str) -> None:
        self.trust, self.purpose = trust, purpose
        self.roles = SIGNERS[purpose]

    def verify_record(self, record: Mapping[str, Any]) -> Verdict:
        sig = record.get(SIGNATURE_FIELD)
        if sig is None:
            return Verdict(False, UNSIGNED, detail=f"the {self.purpose} record carries no "
                                                   "signature")
        if not isinstance(sig, dict) or not all(isinstance(sig.get(f), str)
                                                for f in ("alg", "key_id")):
            return Verdict(False, MALFORMED, detail="signature must be {alg, key_id, sig}")
        key_id = str(sig["key_id"])[:64]
        if sig["alg"] != ALG:
            return Verdict(False, MALFORMED, key_id,
                           f"algorithm {str(sig['alg'])[:40]!r} is not accepted here "
                           f"(only {ALG})")
        if not isinstance(sig.get("sig"), str):
            return Verdict(False, MALFORMED, key_id, "signature.sig must be base64")
        key = self.trust.get(key_id)
        if key is None:
            return Verdict(False, UNKNOWN_KEY, key_id, f"key {key_id!r} is not in the trust "
                                                       "file")
        if key.role not in self.roles and not self._operator_notify(key.role, record):
            return Verdict(False, WRONG_ROLE, key_id,
                           f"a {key.role} key may not sign {self.purpose} records "
                           f"(only {'/'.join(self.roles)})")
        try:
            raw = base64.b64decode(sig["sig"], validate=True)
        except (ValueError, binascii.Error):
            return Verdict(False, MALFORMED, key_id, "signature.sig is not base64")
        if not key.verify(raw, signed_bytes(self.purpose, record)):
            return Verdict(False, BAD_SIGNATURE, key_id,
                           "the signature does not match the content (forged or altered)")
        return Verdict(True, SIGNED, key_id)


    def _operator_notify(self, role: str, record: Mapping[str, Any]) -> bool:
        """An operator may sign a `notify` decision (`faultwatch diagnose` asks the agents
        for stacks that way); restart, blacklist and fail come from processors only."""
        return (self.purpose == DECISION and role == OPERATOR
                and record.get("action") == "notify")


def signer_for(purpose: str, key: SigningKey | None) -> RecordSigner | None:
    return None if key is None else RecordSigner(key, purpose)


def verifier_for(purpose: str, trust: TrustSet | None) -> RecordVerifier | None:
    return None if trust is None else RecordVerifier(trust, purpose)


class RecordGate:
    """The one signature gate: what a consumer of signed records (rule sets, registry
    records, holds, ledgers and, as DecisionGate, decisions) does before applying one. With
    a verifier (Ed25519 trust, or for decisions the legacy HMAC keyring), unsigned
    (tombstones too), unknown-key, wrong-role and altered records are refused (event
    `<what>_refused`, counted in REFUSALS); without one everything passes and the
    `unverified_event` is logged once."""

    unverified_event = ""  # default `<what>_unverified`
    hint = f"no trust file: set {settings.TRUST_FILE} so that unsigned and forged records are " \
           "refused"

    def __init__(self, what: str, verifier: Any, log: Callable[..., None]) -> None:
        self.what, self.verifier, self._log = what, verifier, log
        self.refused = 0
        self._warned = False

    @property
    def verifying(self) -> bool:
        return self.verifier is not None

    def announce(self) -> None:
        if self.verifier is None and not self._warned:
            self._warned = True
            self._log(self.unverified_event or f"{self.what}_unverified", hint=self.hint)

    def refuse(self, reason: str, detail: str, **where: Any) -> None:
        self.refused += 1
        note_refusal(self.what, reason, detail)
        self._log(f"{self.what}_refused", reason=reason, detail=detail, **where)

    def _no_value(self, **where: Any) -> None:
        self.refuse(UNSIGNED, "a tombstone carries no signature: ignored", **where)

    def about(self, record: Mapping[str, Any]) -> dict[str, Any]:
        """What a refusal's event line says of the refused record (besides where it was)."""
        return {}

    def admit_value(self, value: bytes | None, **where: Any) -> bool:
        """For a raw record value as published (None: a tombstone, which no one can sign)."""
        if self.verifier is None:
            self.announce()
            return True
        if value is None:
            self._no_value(**where)
            return False
        try:
            d = orjson.loads(value)
        except orjson.JSONDecodeError:
            d = None
        if not isinstance(d, dict):
            self.refuse(MALFORMED, "not a JSON object", **where)
            return False
        return self.admit(d, **where)

    def admit(self, record: Mapping[str, Any], **where: Any) -> bool:
        if self.verifier is None:
            self.announce()
            return True
        v = signing.verify(record, self.verifier)  # Ed25519 (verify_record) or HMAC
        if v.ok:
            return True
        self.refuse(v.reason, v.detail, key_id=v.key_id, **self.about(record), **where)
        return False


class DecisionGate(RecordGate):
    """The gate of the decisions' consumers (agent, actuator, notifier): `verifier` is
    decision_verifier()'s (trust file, else the HMAC keyring, else None)."""

    unverified_event = "decisions_unverified"
    hint = f"no trust file or decision key: set {settings.TRUST_FILE} (or the legacy " \
           f"{settings.DECISION_KEY_FILE}) so that forged decisions are refused"

    def __init__(self, verifier: Any, log: Callable[..., None]) -> None:
        super().__init__(DECISION, verifier, log)

    def _no_value(self, **where: Any) -> None:
        self.refuse(MALFORMED, "not a JSON object", **where)

    def about(self, record: Mapping[str, Any]) -> dict[str, Any]:
        return {"id": str(record.get("id"))[:256], "job": str(record.get("job"))[:256],
                "action": str(record.get("action"))[:32]}

    admit_record = RecordGate.admit_value  # (the decisions' consumers' name for it)


__all__ = ["DECISION", "DecisionGate", "HOLD", "NODE", "NODE_RECORD", "REFUSALS", "RULES",
           "RecordGate",
           "RecordSigner", "RecordVerifier", "signed_bytes", "signer_for", "verifier_for"]
