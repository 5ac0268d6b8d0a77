"""Which decision signer and verifier a process uses: Ed25519 when a signing key / trust file
is configured, else the legacy HMAC keyring, else none."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from faultwatch.trust.keys import load_signing_key, load_trust
from faultwatch.trust.records import DECISION, RecordSigner, RecordVerifier
from faultwatch.wire.signing import load_keyring


def decision_signer(key_file: Path | None = None, env: Mapping[str, str] | None = None
                    ) -> Any:
    """The processor's: its Ed25519 key ($FAULTWATCH_SIGNING_KEY_FILE), else the HMAC
    keyring ($FAULTWATCH_DECISION_KEY[_FILE]), else None (decisions unsigned)."""
    key = load_signing_key(key_file, env)
    if key is not None:
        return RecordSigner(key, DECISION)
    return load_keyring(env=env)


def decision_verifier(trust_file: Path | None = None, env: Mapping[str, str] | None = None
                      ) -> Any:
    """A consumer's: the processor keys of the trust file ($FAULTWATCH_TRUST_FILE), else the
    HMAC keyring, else None (every decision passes, `decisions_unverified` is logged)."""
    trust = load_trust(trust_file, env)
    if trust is not None:
        return RecordVerifier(trust, DECISION)
    return load_keyring(env=env)


def signer_key_id(signer: Any) -> str | None:
    if signer is None:
        return None
    if isinstance(signer, RecordSigner):
        return signer.key_id
    return str(signer.signing_key.key_id)
