"""Keys and trust files for the trust tests (generated per test in tmp_path)."""

from __future__ import annotations

from pathlib import Path

from faultwatch.trust.keys import SigningKey, TrustSet, generate, parse_trust, read_signing_key


def make_key(tmp: Path, role: str, name: str = "") -> tuple[SigningKey, str]:
    """(private key, trust line) of a fresh key of `role`."""
    path = tmp / f"{role}-{name or 'k'}.key"
    pub = generate(path, role, name)
    return read_signing_key(path), pub.line()


def trust_of(*lines: str) -> TrustSet:
    return parse_trust("\n".join(lines) + "\n", "trust-test")
