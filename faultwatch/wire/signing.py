"""Signed decisions: HMAC-SHA256 over a decision's canonical JSON, keyrings that rotate.

HMAC is the legacy mode (whoever verifies can sign); Ed25519 signatures (faultwatch.trust)
go through the same calls: `sign`, `encode`, `verify` (and so trust.records.DecisionGate)
take either a Keyring or an object with `sign_record` / `verify_record`
(trust.records.RecordSigner / RecordVerifier)."""

from __future__ import annotations

import hashlib
import hmac
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson

from faultwatch import settings
from faultwatch.errors import ConfigError

ALGORITHM = "HMAC-SHA256"
SIGNATURE_FIELD = "signature"
KEY_ENV = settings.DECISION_KEY.name  # "<key-id>:<secret>[,<key-id>:<secret>]"
KEY_FILE_ENV = settings.DECISION_KEY_FILE.name  # lines "<key-id> <secret>", first one signs
MIN_SECRET_CHARS = 16
_KEY_ID = re.compile(r"^[A-Za-z0-9._-]{1,64}$")

# Verdict reasons.
SIGNED, UNSIGNED, UNKNOWN_KEY, BAD_SIGNATURE, MALFORMED = (
    "signed", "unsigned", "unknown_key", "bad_signature", "malformed_signature")


@dataclass(frozen=True)
class Key:
    """One HMAC key: an id published in signatures and the secret, never printed."""

    key_id: str
    secret: bytes = field(repr=False)

    def __post_init__(self) -> None:
        if not _KEY_ID.match(self.key_id):
            raise ConfigError("decision key id", f"{self.key_id!r} must be 1-64 characters "
                                                 "of A-Z a-z 0-9 . _ -")
        if len(self.secret) < MIN_SECRET_CHARS:
            raise ConfigError(f"decision key {self.key_id}",
                              f"the secret must be at least {MIN_SECRET_CHARS} characters")


@dataclass(frozen=True)
class Keyring:
    """The keys a process knows: the first signs, every one verifies (rotation)."""

    keys: tuple[Key, ...]

    def __post_init__(self) -> None:
        if not self.keys:
            raise ConfigError("decision keys", "a keyring needs at least one key")
        ids = [k.key_id for k in self.keys]
        dupes = sorted({i for i in ids if ids.count(i) > 1})
        if dupes:
            raise ConfigError("decision keys", f"key id(s) given twice: {', '.join(dupes)}")

    @property
    def signing_key(self) -> Key:
        return self.keys[0]

    def get(self, key_id: str) -> Key | None:
        return next((k for k in self.keys if k.key_id == key_id), None)


@dataclass(frozen=True)
class Verdict:
    """Whether a decision's signature holds, and why not."""

    ok: bool
    reason: str  # one of SIGNED, UNSIGNED, UNKNOWN_KEY, BAD_SIGNATURE, MALFORMED
    key_id: str | None = None
    detail: str = ""


def canonical(decision: Mapping[str, Any]) -> bytes:
    """The signed bytes: compact JSON with sorted keys, without the signature field."""
    body = {k: v for k, v in decision.items() if k != SIGNATURE_FIELD}
    return orjson.dumps(body, option=orjson.OPT_SORT_KEYS)


def _mac(key: Key, decision: Mapping[str, Any]) -> str:
    return hmac.new(key.secret, canonical(decision), hashlib.sha256).hexdigest()


def sign(decision: Mapping[str, Any], keyring: Any) -> dict[str, Any]:
    """A copy of the decision dict with `signature: {alg, key_id, mac}` by the signing key
    (an Ed25519 signer's own signature when given one)."""
    if not isinstance(keyring, Keyring):
        return dict(keyring.sign_record(decision))
    key = keyring.signing_key
    out = {k: v for k, v in decision.items() if k != SIGNATURE_FIELD}
    out[SIGNATURE_FIELD] = {"alg": ALGORITHM, "key_id": key.key_id, "mac": _mac(key, out)}
    return out


def verify(decision: Mapping[str, Any], keyring: Any) -> Verdict:
    """Check the signature of a decoded decision dict against every key of the ring (or
    with an Ed25519 verifier's verify_record)."""
    if not isinstance(keyring, Keyring):
        return keyring.verify_record(decision)
    sig = decision.get(SIGNATURE_FIELD)
    if sig is None:
        return Verdict(False, UNSIGNED, detail="the decision carries no signature")
    if not isinstance(sig, dict) or not all(isinstance(sig.get(f), str)
                                            for f in ("alg", "key_id", "mac")):
        return Verdict(False, MALFORMED, detail="signature must be {alg, key_id, mac} strings")
    key_id = str(sig["key_id"])[:64]
    if sig["alg"] != ALGORITHM:
        return Verdict(False, MALFORMED, key_id, f"unsupported algorithm {sig['alg']!r:.40}")
    key = keyring.get(sig["key_id"])
    if key is None:
        known = ", ".join(k.key_id for k in keyring.keys)
        return Verdict(False, UNKNOWN_KEY, key_id, f"key {key_id!r} is not one of {known}")
    if not hmac.compare_digest(_mac(key, decision), sig["mac"]):
        return Verdict(False, BAD_SIGNATURE, key_id,
                       "the signature does not match the content (forged or altered)")
    return Verdict(True, SIGNED, key_id)


def encode(decision: Mapping[str, Any], keyring: Any) -> bytes:
    """The record value of a decision dict: signed when a keyring is configured."""
    return orjson.dumps(sign(decision, keyring) if keyring is not None else dict(decision))


def parse_keys(text: str, source: str) -> Keyring:
    """Keys from `id secret` or `id:secret` entries, one a line or comma separated."""
    keys: list[Key] = []
    entries = [e.strip() for line in text.splitlines() for e in line.split(",")]
    for n, entry in enumerate(entries, 1):
        if not entry or entry.startswith("#"):
            continue
        parts = entry.split(None, 1)
        key_id, sep, secret = (parts[0], " ", parts[1]) if len(parts) == 2 \
            else entry.partition(":")
        if not sep or not secret.strip():
            raise ConfigError(source, f"entry {n}: expected '<key-id> <secret>' or "
                                      "'<key-id>:<secret>'")
        keys.append(Key(key_id.strip(), secret.strip().encode()))
    if not keys:
        raise ConfigError(source, "no keys found")
    return Keyring(tuple(keys))


def load_keyring(key_file: Path | None = None,
                 env: Mapping[str, str] | None = None) -> Keyring | None:
    """The keyring from `key_file`, else $FAULTWATCH_DECISION_KEY_FILE, else
    $FAULTWATCH_DECISION_KEY; None when no key is configured."""
    path = key_file or settings.DECISION_KEY_FILE.get(env)
    if path is not None:
        try:
            text = path.read_text()
        except OSError as exc:
            raise ConfigError(str(path), f"cannot read the decision key file: "
                                         f"{exc.strerror or exc}") from exc
        return parse_keys(text, str(path))
    keys = settings.DECISION_KEY.raw(env)
    return None if keys is None else parse_keys(keys, KEY_ENV)
