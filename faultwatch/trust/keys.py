"""Ed25519 keys: private key files (PEM, mode 0600), key ids and fingerprints, trust files.

A trust file lists the public keys consumers accept, one a line:

    # role      alg      public key (base64 of the 32 raw bytes)        name
    processor   ed25519  q0u6m3G5...=                                   proc-2026-11
    operator    ed25519  Zx1Q...=                                       ops
    node        ed25519  7hVb...=                                       gpu-07

`processor` keys sign decisions and the processor's registry records, `operator` keys sign
rule sets and manual registry records, a `node` key signs what that node's agent sends (the
name is the node it speaks for). Two keys of a role are both valid (rotation). The key id is
derived from the key itself (the first 16 hex digits of its SHA-256), never taken from the
file, so a line cannot claim another key's id.
"""

from __future__ import annotations

import base64
import hashlib
import os
import stat
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from faultwatch import settings
from faultwatch.errors import ConfigError

ALG = "Ed25519"
PROCESSOR, OPERATOR, NODE = "processor", "operator", "node"
ROLES = (PROCESSOR, OPERATOR, NODE)
TRUST_FILE_ENV = settings.TRUST_FILE.name  # public keys this process accepts
SIGNING_KEY_FILE_ENV = settings.SIGNING_KEY_FILE.name  # processor's or operator's private key
NODE_KEY_FILE_ENV = settings.NODE_KEY_FILE.name  # the agent's node key (never passed on)
KEY_ID_HEX = 16


def key_id_of(raw: bytes) -> str:
    """A public key's id: the first 16 hex digits of the SHA-256 of its 32 raw bytes."""
    return hashlib.sha256(raw).hexdigest()[:KEY_ID_HEX]


def fingerprint_of(raw: bytes) -> str:
    """The SSH-style fingerprint: SHA256:<base64 of the digest, unpadded>."""
    return "SHA256:" + base64.b64encode(hashlib.sha256(raw).digest()).decode().rstrip("=")


@dataclass(frozen=True)
class PublicKey:
    """One trusted public key: its role, raw bytes and name (the node, for a node key)."""

    role: str
    raw: bytes
    name: str = ""
    _key: Any = field(default=None, repr=False, compare=False)

    def __post_init__(self) -> None:
        from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

        if self.role not in ROLES:
            raise ConfigError("trust file", f"role {self.role!r} must be one of {ROLES}")
        if len(self.raw) != 32:
            raise ConfigError("trust file", "an Ed25519 public key is 32 bytes")
        object.__setattr__(self, "_key", Ed25519PublicKey.from_public_bytes(self.raw))

    @property
    def key_id(self) -> str:
        return key_id_of(self.raw)

    @property
    def fingerprint(self) -> str:
        return fingerprint_of(self.raw)

    def line(self) -> str:
        """The trust-file line for this key."""
        b64 = base64.b64encode(self.raw).decode()
        return f"{self.role} ed25519 {b64}" + (f" {self.name}" if self.name else "")

    def verify(self, signature: bytes, data: bytes) -> bool:
        from cryptography.exceptions import InvalidSignature

        try:
            self._key.verify(signature, data)
            return True
        except InvalidSignature:
            return False


@dataclass(frozen=True)
class SigningKey:
    """A private Ed25519 key this process signs with; the key material is never printed."""

    key_id: str
    _key: Any = field(repr=False)
    source: str = ""

    def sign(self, data: bytes) -> bytes:
        return bytes(self._key.sign(data))

    @property
    def public_raw(self) -> bytes:
        from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat

        return bytes(self._key.public_key().public_bytes(Encoding.Raw, PublicFormat.Raw))


@dataclass(frozen=True)
class TrustSet:
    """The public keys a consumer accepts, by key id."""

    keys: tuple[PublicKey, ...]
    source: str = ""

    def __post_init__(self) -> None:
        ids = [k.key_id for k in self.keys]
        dupes = sorted({i for i in ids if ids.count(i) > 1})
        if dupes:
            raise ConfigError(self.source or "trust file",
                              f"a key is listed twice (key id {', '.join(dupes)}): give each "
                              "key one role")

    def get(self, key_id: str) -> PublicKey | None:
        return next((k for k in self.keys if k.key_id == key_id), None)

    def of_role(self, *roles: str) -> list[PublicKey]:
        return [k for k in self.keys if k.role in roles]


def parse_trust(text: str, source: str) -> TrustSet:
    """A TrustSet from trust-file text; ConfigError naming `source:line` on a bad line."""
    keys: list[PublicKey] = []
    for n, line in enumerate(text.splitlines(), 1):
        line = line.split("#", 1)[0].strip()
        if not line:
            continue
        parts = line.split()
        where = f"{source}:{n}"
        if len(parts) not in (3, 4) or parts[1].lower() != "ed25519":
            raise ConfigError(where, "expected '<role> ed25519 <base64 public key> [name]'")
        role, b64 = parts[0], parts[2]
        name = parts[3] if len(parts) == 4 else ""
        if role not in ROLES:
            raise ConfigError(where, f"role {role!r} must be one of {', '.join(ROLES)}")
        if role == NODE and not name:
            raise ConfigError(where, "a node key needs the node's name as its fourth field")
        try:
            raw = base64.b64decode(b64, validate=True)
        except ValueError:
            raise ConfigError(where, "the public key is not base64") from None
        if len(raw) != 32:
            raise ConfigError(where, f"an Ed25519 public key is 32 bytes, this one {len(raw)}")
        keys.append(PublicKey(role, raw, name))
    return TrustSet(tuple(keys), source)


def load_trust(path: Path | None = None, env: Mapping[str, str] | None = None
               ) -> TrustSet | None:
    """The trust file named by `path`, else $FAULTWATCH_TRUST_FILE; None when neither."""
    if path is None:
        path = settings.TRUST_FILE.get(env)
    if path is None:
        return None
    try:
        text = path.read_text()
    except OSError as exc:
        raise ConfigError(str(path), f"cannot read the trust file: {exc.strerror or exc}"
                          ) from None
    trust = parse_trust(text, str(path))
    if not trust.keys:
        raise ConfigError(str(path), "the trust file lists no key")
    return trust


def read_signing_key(path: Path) -> SigningKey:
    """A private key file written by `faultwatch keys generate`. A file others may read is
    refused (like ssh does); errors never quote the file's content."""
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
    from cryptography.hazmat.primitives.serialization import load_pem_private_key

    try:
        st = path.stat()
        data = path.read_bytes()
    except OSError as exc:
        raise ConfigError(str(path), f"cannot read the private key: {exc.strerror or exc}"
                          ) from None
    if st.st_mode & (stat.S_IROTH | stat.S_IWOTH | stat.S_IWGRP):
        raise ConfigError(str(path), f"the private key file is mode {stat.S_IMODE(st.st_mode):o}"
                                     ": others may read or change it (chmod 600)")
    try:
        key = load_pem_private_key(data, password=None)
    except (ValueError, TypeError):
        raise ConfigError(str(path), "not an unencrypted PEM private key") from None
    if not isinstance(key, Ed25519PrivateKey):
        raise ConfigError(str(path), "not an Ed25519 private key")
    sk = SigningKey("", key, str(path))
    object.__setattr__(sk, "key_id", key_id_of(sk.public_raw))
    return sk


def load_signing_key(path: Path | None = None, env: Mapping[str, str] | None = None,
                     var: str = SIGNING_KEY_FILE_ENV) -> SigningKey | None:
    """The private key file `path`, else the one the environment variable `var` names."""
    if path is None:
        path = settings.var(var).get(env)
    return None if path is None else read_signing_key(path)


def generate(path: Path, role: str, name: str = "") -> PublicKey:
    """A new key pair: the private key to `path` (created 0600, never overwritten) and its
    trust-file line to `path` + ".pub". Returns the public key."""
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
    from cryptography.hazmat.primitives.serialization import (
        Encoding,
        NoEncryption,
        PrivateFormat,
        PublicFormat,
    )

    if role not in ROLES:
        raise ConfigError("--role", f"must be one of {', '.join(ROLES)}")
    if role == NODE and not name:
        raise ConfigError("--node", "a node key needs the node's name")
    pub_path = Path(f"{path}.pub")
    for p in (path, pub_path):
        if p.exists():
            raise ConfigError(str(p), "exists already: keys are never overwritten")
    key = Ed25519PrivateKey.generate()
    pem = key.private_bytes(Encoding.PEM, PrivateFormat.PKCS8, NoEncryption())
    raw = key.public_key().public_bytes(Encoding.Raw, PublicFormat.Raw)
    pub = PublicKey(role, raw, name)
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except OSError as exc:
        raise ConfigError(str(path), f"cannot create the key file: {exc.strerror or exc}"
                          ) from None
    with os.fdopen(fd, "wb") as f:
        f.write(pem)
    pub_path.write_text(pub.line() + "\n")
    return pub


def describe(keys: Iterable[PublicKey]) -> list[str]:
    """One line per key: role, key id, fingerprint, name (what `keys show` prints)."""
    return [f"{k.role:9} key_id={k.key_id} {k.fingerprint}" + (f" name={k.name}" if k.name
                                                                 else "") for k in keys]
