"""A per-user cache of compiled pattern databases, authenticated before anything is loaded.

A hyperscan database is bytecode the library runs natively: a corrupt or planted file could
steer its scan anywhere in memory. So a cache entry is only handed to the engine when:
  - it lives in a directory of this user's own (owner = euid, no group/other access, not a
    symlink): $FAULTWATCH_RULES_CACHE, else $XDG_CACHE_HOME/faultwatch/rules, else
    ~/.cache/faultwatch/rules, made 0700;
  - the file is a regular file of this user's, 0600, below MAX_ENTRY_BYTES, opened without
    following links;
  - its HMAC-SHA256 under a per-user random key (`key` in that directory, 0600, made once)
    covers the entry's material (the patterns, flags, engine and library versions, the CPU)
    and its payload: a file from another user, machine or key, renamed from another entry,
    truncated or flipped, is refused, counted and rebuilt, never trusted.
Anything odd turns the cache off for that call (compile as without it); nothing raises.
FAULTWATCH_RULES_CACHE=off turns it off.
"""

from __future__ import annotations

import hashlib
import hmac
import logging
import os
import platform
import stat
from collections import Counter
from pathlib import Path

from faultwatch import settings

log = logging.getLogger(__name__)

CACHE_ENV = settings.RULES_CACHE.name
MAGIC = b"FWRULEDB1\n"
KEY_BYTES = 32
TAG_BYTES = 32
MAX_ENTRY_BYTES = 256 << 20
MAX_ENTRIES = 64  # past this many entries the oldest go (each rule-set change makes new ones)
stats: Counter[str] = Counter()  # hits, misses, refused, writes, off (tests and benches read it)
_warned: set[str] = set()


def cache_dir() -> Path | None:
    """The cache directory (not yet checked), or None when turned off."""
    env = os.environ.get(CACHE_ENV)
    if env is not None:
        return None if env.strip().lower() in ("", "0", "off", "no") else Path(env)
    xdg = os.environ.get("XDG_CACHE_HOME")
    base = Path(xdg) if xdg and os.path.isabs(xdg) else Path.home() / ".cache"
    return base / "faultwatch" / "rules"


def _own_private(st: os.stat_result, kind: int) -> bool:
    return (stat.S_IFMT(st.st_mode) == kind and st.st_uid == os.geteuid()
            and st.st_mode & 0o077 == 0)


def _refuse(why: str) -> None:
    stats["off"] += 1
    if why not in _warned:
        _warned.add(why)
        log.warning("rules_cache_off reason=%s (compiling without the cache)", why)


def _private_dir() -> Path | None:
    d = cache_dir()
    if d is None:
        return None
    try:
        d.mkdir(mode=0o700, parents=True, exist_ok=True)
        st = os.lstat(d)
    except OSError as e:
        _refuse(f"cannot make {d}: {e.strerror}")
        return None
    if not _own_private(st, stat.S_IFDIR):
        _refuse(f"{d} is not a directory of this user's with mode 0700")
        return None
    return d


def _read_private(path: Path, limit: int) -> bytes | None:
    """The file's bytes if it is a regular 0600 file of this user's below `limit`."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        st = os.fstat(fd)
        if not _own_private(st, stat.S_IFREG) or st.st_size > limit:
            stats["refused"] += 1
            return None
        with os.fdopen(fd, "rb", closefd=False) as f:
            return f.read(limit + 1)
    finally:
        os.close(fd)


def _write_private(d: Path, path: Path, data: bytes, *, exclusive: bool = False) -> bool:
    """Write `data` to `path` atomically (a 0600 temporary file in `d`, then rename; with
    `exclusive` a link that fails when `path` exists). False when it could not."""
    tmp = d / f".tmp-{os.urandom(8).hex()}"
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC,
                     0o600)
    except OSError:
        return False
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        if exclusive:
            os.link(tmp, path)
        else:
            os.replace(tmp, path)
        return True
    except OSError:
        return False
    finally:
        try:
            os.unlink(tmp)
        except OSError:
            pass


def _key(d: Path) -> bytes | None:
    path = d / "key"
    key = _read_private(path, KEY_BYTES)
    if key is None and not path.exists():
        _write_private(d, path, os.urandom(KEY_BYTES), exclusive=True)  # (a racer may win)
        key = _read_private(path, KEY_BYTES)
    if key is None or len(key) != KEY_BYTES:
        _refuse(f"{path} is not this user's 0600 key of {KEY_BYTES} bytes")
        return None
    return key


_HOST: bytes | None = None


def host_material() -> bytes:
    """What a compiled database depends on besides its patterns: the machine and its CPU's
    feature flags (a database built for AVX-512 must not meet a CPU without it)."""
    global _HOST
    if _HOST is None:
        flags = ""
        try:
            with open("/proc/cpuinfo", encoding="ascii", errors="replace") as f:
                for line in f:
                    if line.startswith(("flags", "Features")):
                        flags = line
                        break
        except OSError:
            pass
        _HOST = f"{platform.machine()}\0{flags}".encode()
    return _HOST


def _entry(material: bytes) -> tuple[bytes, str]:
    digest = hashlib.sha256(host_material() + b"\0" + material).digest()
    return digest, digest.hex()[:40] + ".db"


def load(material: bytes) -> bytes | None:
    """The payload stored for `material`, authenticated; None when absent or refused."""
    d = _private_dir()
    key = _key(d) if d is not None else None
    if d is None or key is None:
        return None
    digest, name = _entry(material)
    raw = _read_private(d / name, MAX_ENTRY_BYTES)
    if raw is None:
        stats["misses"] += 1
        return None
    head = len(MAGIC) + TAG_BYTES
    tag = hmac.new(key, digest + raw[head:], hashlib.sha256).digest()
    if len(raw) < head or raw[:len(MAGIC)] != MAGIC \
            or not hmac.compare_digest(raw[len(MAGIC):head], tag):
        stats["refused"] += 1
        log.warning("rules_cache_refused entry=%s (not authenticated: rebuilt)", name)
        return None
    stats["hits"] += 1
    return raw[head:]


def store(material: bytes, payload: bytes) -> None:
    """Keep `payload` for `material` (best effort: a failure is only counted)."""
    d = _private_dir()
    key = _key(d) if d is not None else None
    if d is None or key is None or len(payload) > MAX_ENTRY_BYTES - 64:
        return
    digest, name = _entry(material)
    tag = hmac.new(key, digest + payload, hashlib.sha256).digest()
    if _write_private(d, d / name, MAGIC + tag + payload):
        stats["writes"] += 1
        _prune(d)


def _prune(d: Path) -> None:
    try:
        entries = [(e.stat().st_mtime, e.path) for e in os.scandir(d)
                   if e.name.endswith(".db") and e.is_file(follow_symlinks=False)]
        for _, path in sorted(entries)[:max(0, len(entries) - MAX_ENTRIES)]:
            os.unlink(path)
    except OSError:
        pass
