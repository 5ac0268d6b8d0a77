"""The compiled-database cache: used when authentic, refused and rebuilt when not."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from faultwatch.rules import dbcache
from faultwatch.rules.patterns import Pattern, build_scanner, fast_engine_errors

pytest.importorskip("hyperscan")

PATS = [Pattern(r"CUDA error: (an illegal|out of) memory", 0),
        Pattern(r"^Traceback \(most recent", 1), Pattern("NCCL WARN", 2, ignore_case=True)]
DATA = b"x\nRuntimeError: CUDA error: out of memory\nTraceback (most recent call last):\nnccl warn"


@pytest.fixture
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    d = tmp_path / "c"
    monkeypatch.setenv(dbcache.CACHE_ENV, str(d))
    dbcache.stats.clear()
    return d


def scan() -> list[tuple[int, int]]:
    return sorted(build_scanner(PATS, "hyperscan")[0](DATA))


def entries(d: Path) -> list[Path]:
    return sorted(d.glob("*.db"))


def test_warm_cache_loads_what_was_compiled(cache: Path) -> None:
    cold = scan()
    assert dbcache.stats["writes"] == 1 and dbcache.stats["hits"] == 0
    assert (cache.stat().st_mode & 0o777) == 0o700
    assert all((p.stat().st_mode & 0o777) == 0o600 for p in [cache / "key", *entries(cache)])
    assert scan() == cold and len(cold) == 3
    assert dbcache.stats["hits"] == 1


@pytest.mark.parametrize("spoil", ["flip", "truncate", "foreign_key", "renamed"])
def test_unauthentic_entry_is_refused_and_rebuilt(cache: Path, spoil: str) -> None:
    cold = scan()
    (entry,) = entries(cache)
    raw = entry.read_bytes()
    if spoil == "flip":
        entry.write_bytes(raw[:-100] + bytes([raw[-100] ^ 1]) + raw[-99:])
    elif spoil == "truncate":
        entry.write_bytes(raw[:len(raw) // 2])
    elif spoil == "foreign_key":  # a file made under another user's (or machine's) key
        (cache / "key").write_bytes(os.urandom(dbcache.KEY_BYTES))
    else:  # a genuine entry of other patterns under this entry's name
        build_scanner([Pattern("something else", 0)], "hyperscan")
        other = next(p for p in entries(cache) if p != entry)
        entry.write_bytes(other.read_bytes())
    dbcache.stats.clear()
    assert scan() == cold
    assert dbcache.stats["refused"] == 1 and dbcache.stats["hits"] == 0
    assert dbcache.stats["writes"] == 1  # rebuilt
    dbcache.stats.clear()
    assert scan() == cold and dbcache.stats["hits"] == 1  # positive control: the rebuilt one


def test_cache_off_in_a_directory_others_may_use(cache: Path) -> None:
    scan()
    cache.chmod(0o755)
    dbcache.stats.clear()
    assert scan()
    assert dbcache.stats["hits"] == 0 and dbcache.stats["writes"] == 0 and dbcache.stats["off"]


def test_symlinked_or_open_entry_is_refused(cache: Path, tmp_path: Path) -> None:
    scan()
    (entry,) = entries(cache)
    elsewhere = tmp_path / "planted"
    elsewhere.write_bytes(entry.read_bytes())
    entry.unlink()
    entry.symlink_to(elsewhere)
    dbcache.stats.clear()
    scan()
    assert dbcache.stats["hits"] == 0
    entry.unlink()
    scan()  # a fresh entry, then made readable by others
    entry.chmod(0o644)
    dbcache.stats.clear()
    scan()
    assert dbcache.stats["hits"] == 0 and dbcache.stats["refused"] == 1


def test_turned_off(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(dbcache.CACHE_ENV, "off")
    dbcache.stats.clear()
    assert scan()
    assert not dbcache.stats["hits"] and not dbcache.stats["writes"]


def test_validation_is_one_compile_and_finds_each_bad_pattern(cache: Path) -> None:
    good = [(r"error: \d+ items", False), ("NCCL WARN", True)] * 20
    bad = [(r"(a)\1", False), (r"foo(?=bar)", False)]
    items = [*good[:7], bad[0], *good[7:30], bad[1], *good[30:]]
    errs = fast_engine_errors(items)
    assert [i for i, e in enumerate(errs) if e] == [7, 31]
    assert "linear-time engine" in (errs[7] or "") and "(a)\\\\1" in (errs[7] or "")
    assert dbcache.stats["writes"] == 0  # a failing set's verdict is not kept
    assert fast_engine_errors(good) == [None] * len(good)
    assert dbcache.stats["writes"] == 1
    dbcache.stats.clear()
    assert fast_engine_errors(good) == [None] * len(good)
    assert dbcache.stats["hits"] == 1
