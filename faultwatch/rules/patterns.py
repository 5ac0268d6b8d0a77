"""Compiles rule patterns into one linear-time multi-pattern database (hyperscan, else re2)."""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import regex

from faultwatch.rules import dbcache
from faultwatch.rules.normalise import PREFIX_RUN
from faultwatch.rules.validate import REGEX_TIMEOUT_S

log = logging.getLogger(__name__)
_SPECIAL = set("\\.^$|?*+()[]{}")

Scanner = Callable[[str], list[tuple[int, int]]]

def lit_escape(s: str) -> str:
    """A literal string as a regex accepted by regex, hyperscan, re2 and ripgrep alike."""
    return "".join("\\" + c if c in _SPECIAL else c for c in s)


# what ends every prefix of normalise.PREFIX_KINDS: `]`, `)`, `>`, `:`, `|` (and a space), or
# a timestamp's `Z` / last digit and a space. The fast scan replaces `^` by "line start or
# one of these": a superset of "after a run of prefixes" that costs the scan almost nothing
# (the exact path then decides with plain `^` on stripped lines)
LOOSE_ANCHOR = r"(?:^|[\])>:|] ?|[Z0-9] )"


def anchor_after_prefix(source: str, anchor: str | None = None) -> str:
    """`source` with each line-start anchor `^` (outside character classes) also accepting
    a run of known line prefixes before it (normalise.PREFIX_KINDS: `[rank3]:`, timestamps,
    `srun -l` labels...), so it matches lines that still carry them as it would match them
    stripped. `anchor`: what to put instead (LOOSE_ANCHOR for the fast scan)."""
    out: list[str] = []
    i, n, in_class = 0, len(source), False
    while i < n:
        c = source[i]
        if c == "\\":
            out.append(source[i:i + 2])
            i += 2
            continue
        if in_class:
            if c == "]":
                in_class = False
        elif c == "[":
            in_class = True
            out.append(c)
            i += 1
            if i < n and source[i] == "^":
                out.append("^")
                i += 1
            if i < n and source[i] == "]":  # a literal ] first in the class
                out.append("]")
                i += 1
            continue
        elif c == "^":
            out.append("^" + PREFIX_RUN if anchor is None else anchor)
            i += 1
            continue
        out.append(c)
        i += 1
    return "".join(out)


def _fast_error_message(source: str, why: str) -> str:
    return (f"pattern {source!r} cannot run in the linear-time engine ({why}); it would "
            "fall back to backtracking on every line. Use plain regex syntax without "
            "backreferences, lookarounds, branch resets or huge counted repeats")


def fast_engine_errors(items: Sequence[tuple[str, bool]]) -> list[str | None]:
    """For each (source, ignore_case): a message when the pattern cannot run in the
    linear-time engine exactly (hyperscan, else re2): it would be confirmed by the
    backtracking `regex` module on every candidate line, so one such pattern can slow the
    whole matcher. None when it can (or when neither engine is installed here: the
    matcher's per-match timeout then bounds it). One compile of them all when
    they all can (the common case; its verdict is cached, rules/dbcache.py); when one
    cannot, the failing ones are found by halving (a compile per half that fails)."""
    if not items:
        return []
    srcs = [anchor_after_prefix(src).encode() for src, _ in items]
    hs: Any
    try:
        import hyperscan as hs
    except ImportError:
        hs = None
    if hs is None:
        return [_re2_error(src, ic) for src, ic in items]
    flags = [hs.HS_FLAG_MULTILINE | (hs.HS_FLAG_CASELESS if ic else 0) for _, ic in items]
    material = _material("validate", srcs, flags)
    if dbcache.load(material) == b"ok":
        return [None] * len(items)
    out: list[str | None] = [None] * len(items)

    def check(idx: list[int]) -> None:
        try:
            hs.Database().compile(expressions=[srcs[i] for i in idx], ids=list(range(len(idx))),
                                  flags=[flags[i] for i in idx])
        except hs.error as e:
            if len(idx) == 1:
                out[idx[0]] = _fast_error_message(items[idx[0]][0],
                                                  str(e) or "unsupported construct")
                return
            check(idx[:len(idx) // 2])
            check(idx[len(idx) // 2:])

    check(list(range(len(items))))
    if not any(out):
        dbcache.store(material, b"ok")
    return out


def _re2_error(source: str, ignore_case: bool) -> str | None:
    try:
        import re2
    except ImportError:
        return None
    try:
        re2.compile(("(?i)" if ignore_case else "") + anchor_after_prefix(source))
        return None
    except Exception as e:  # re2 raises its own error type
        return _fast_error_message(source, str(e) or "unsupported construct")


def _material(kind: str, exprs: Sequence[bytes], flags: Sequence[int]) -> bytes:
    """What a compiled hyperscan database (or a verdict on one) depends on."""
    import hyperscan as hs
    version = getattr(hs, "__version__", "?")  # (the wheel pins its library's version)
    return b"\0".join([kind.encode(), f"hyperscan {version}".encode(),
                        *(b"%d:%s" % (f, e) for f, e in zip(flags, exprs, strict=True))])


@dataclass(frozen=True, slots=True)
class Pattern:
    """One pattern of the database; `owner` is the index of its rule (or a marker below 0)."""

    source: str
    owner: int
    ignore_case: bool = False
    single: bool = False  # report it once per scan at most (hyperscan; re2 reports all)


def _hyperscan_db(exprs: list[bytes], flags: list[int]) -> tuple[Any, set[int]]:
    """A block-mode database of `exprs` (ids = positions) and the ids compiled in prefilter
    mode (those hyperscan cannot run exactly), from the user's cache when it holds an
    authenticated copy (rules/dbcache.py), else compiled and kept there."""
    import hyperscan as hs

    material = _material("scan", exprs, flags)
    cached = dbcache.load(material)
    if cached is not None and len(cached) >= 4:
        n = int.from_bytes(cached[:4], "little")
        try:
            pre = {int.from_bytes(cached[4 + 4 * i:8 + 4 * i], "little") for i in range(n)}
            return hs.loadb(cached[4 + 4 * n:], hs.HS_MODE_BLOCK), pre
        except (hs.error, ValueError, TypeError) as err:  # (authenticated, yet refused)
            log.warning("rules_cache_unloadable error=%s (rebuilt)", err)
    flags = list(flags)
    prefilter: set[int] = set()
    db = hs.Database()
    try:
        db.compile(expressions=exprs, ids=list(range(len(exprs))), flags=flags)
    except hs.error:
        for i, e in enumerate(exprs):  # find the ones hyperscan cannot compile exactly
            try:
                hs.Database().compile(expressions=[e], ids=[0], flags=[flags[i]])
            except hs.error:
                flags[i] |= hs.HS_FLAG_PREFILTER
                prefilter.add(i)
        db.compile(expressions=exprs, ids=list(range(len(exprs))), flags=flags)
    head = len(prefilter).to_bytes(4, "little") + b"".join(
        i.to_bytes(4, "little") for i in sorted(prefilter))
    dbcache.store(material, head + hs.dumpb(db))
    return db, prefilter


def _hyperscan_scanner(pats: Sequence[Pattern]) -> tuple[Scanner, set[int]]:
    """A scanner over a joined batch; returns also the ids compiled in prefilter mode."""
    import hyperscan as hs  # lazy: optional, x86-64 only

    base = hs.HS_FLAG_MULTILINE
    flags = [base | (hs.HS_FLAG_CASELESS if p.ignore_case else 0)
             | (hs.HS_FLAG_SINGLEMATCH if p.single else 0) for p in pats]
    db, prefilter = _hyperscan_db([p.source.encode() for p in pats], flags)
    scratch = hs.Scratch(db)

    def scan(data: str | bytes) -> list[tuple[int, int]]:
        hits: list[tuple[int, int]] = []
        add = hits.append

        def on(pid: int, _frm: int, to: int, _flags: int, _ctx: Any) -> None:
            add((to, pid))

        raw = data if isinstance(data, bytes) else data.encode("utf-8", "replace")
        db.scan(raw, match_event_handler=on, scratch=scratch)
        return hits

    return scan, prefilter


def _re2_scanner(pats: Sequence[Pattern], on_timeout: Callable[[int], None] | None = None
                 ) -> tuple[Scanner, set[int]]:
    """Fallback: one re2 alternation finds candidate lines, an re2 Set names the patterns."""
    import re2

    ok: list[int] = []
    slow: list[tuple[int, Any]] = []
    for i, p in enumerate(pats):
        src = ("(?i)" if p.ignore_case else "") + p.source
        try:
            re2.compile(src)
            ok.append(i)
        except Exception:
            slow.append((i, regex.compile(src, regex.MULTILINE)))
    opts = re2.Options()
    opts.max_mem = 256 << 20
    rset = re2.Set.SearchSet(opts)
    for i in ok:
        rset.Add(("(?i)" if pats[i].ignore_case else "") + pats[i].source)
    rset.Compile()
    alt = re2.compile("(?m)" + ("|".join(
        f"(?:{'(?i)' if pats[i].ignore_case else ''}{pats[i].source})" for i in ok) or "$^"),
        opts)

    def scan(data: str) -> list[tuple[int, int]]:
        hits: list[tuple[int, int]] = []
        pos = 0
        while True:
            m = alt.search(data, pos)
            if m is None:
                break
            start = data.rfind("\n", 0, m.start()) + 1
            end = data.find("\n", m.end())
            end = len(data) if end < 0 else end
            line = data[start:end]
            for k in rset.Match(line) or ():
                hits.append((end, ok[k]))
            pos = end + 1
        for i, rx in slow:
            try:
                for m in rx.finditer(data, timeout=REGEX_TIMEOUT_S * 10):
                    end = data.find("\n", m.end())
                    hits.append((len(data) if end < 0 else end, i))
            except TimeoutError:
                if on_timeout is not None:
                    on_timeout(i)
                else:
                    log.warning("pattern %r timed out", pats[i].source)
        hits.sort()
        return hits

    return scan, {i for i, _ in slow}


def build_scanner(pats: Sequence[Pattern], engine: str = "auto",
                  on_timeout: Callable[[int], None] | None = None
                  ) -> tuple[Scanner, set[int], str]:
    """(scan, ids that need confirming with the regex module, engine name).

    scan(joined) returns (end offset, pattern id) pairs; offsets are bytes for hyperscan
    (`engine == "hyperscan"`) and characters for re2. `on_timeout(id)` hears of a
    backtracking search that timed out (re2's fallback for patterns it cannot compile).
    """
    if engine in ("auto", "hyperscan"):
        try:
            scan, pre = _hyperscan_scanner(pats)
            return scan, pre, "hyperscan"
        except Exception as e:  # not installed, unsupported CPU, or a pattern it refuses
            if engine == "hyperscan":
                raise
            log.info("hyperscan unavailable (%s); using re2", e)
    scan, pre = _re2_scanner(pats, on_timeout)
    return scan, pre, "re2"
