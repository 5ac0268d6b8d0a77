"""The Matcher: scans batches of lines with one multi-pattern database and builds matches."""

from __future__ import annotations

import logging
import re
from bisect import bisect_left
from collections import Counter
from collections.abc import Sequence
from dataclasses import replace
from itertools import accumulate, compress, repeat
from operator import add, itemgetter
from typing import Any, cast

import regex

from faultwatch.core.events import EXIT_STREAM, Line, Match, line_times
from faultwatch.rules.loss import LossScanner
from faultwatch.rules.model import MatchBatch, ProgressMark, Rule, RuleSet, StageMark
from faultwatch.rules.native import batchscan
from faultwatch.rules.normalise import (
    NOT_A_RUN,
    line_ranks,
    normalise_batch,
    normalise_line,
    run_rank_of,
    strip_prefixes,
)
from faultwatch.rules.patterns import (
    CARRIER_KINDS,
    LOOSE_ANCHOR,
    MID_PREFIX_PATTERN,
    PREFIX_TOKEN,
    RANK_CARRIER_PATTERN,
    CarrierKind,
    Pattern,
    anchor_after_prefix,
    build_scanner,
    lit_escape,
)
from faultwatch.rules.prefix import PREFIX_RE, split_prefixed
from faultwatch.rules.traceback import (
    CONTEXT_LINES,
    CPP_START,
    TB_START,
    Block,
    find_blocks,
)
from faultwatch.rules.validate import REGEX_TIMEOUT_S

log = logging.getLogger(__name__)
MARK_BLOCK = -1  # pattern owner for "a traceback / terminate block starts here"
_HELD_NEWLINE = -3  # _carried_ranks: a token holding a newline (a line holding a newline)
MARK_PREFIX = -2  # pattern owner for line prefixes (that there are some, not what they say)
USER_PRIORITY = 100
_RANK_TOKEN = re.compile(PREFIX_TOKEN, re.ASCII)  # a `[word3]:` token anywhere
PROGRESS_TAIL = 8  # lines per rank scanned first for its last step
# a regex-module search's (pos, endpos, concurrent, partial, timeout), positional: keywords
# cost ~1.5 us a call (as much as the search of a step line), and concurrent=False keeps the
# GIL (by default the module releases and retakes it for every str searched, ~0.7 us)
_SEARCH_ARGS = (None, None, False, False, REGEX_TIMEOUT_S)


def _policy_rules(ruleset: RuleSet) -> list[Rule]:
    extra = ruleset.policy.get("retryable_errors") or []
    assert isinstance(extra, list)
    return [Rule(id=f"policy.retryable_errors.{i}", category="retryable", contains=(s,),
                 priority=USER_PRIORITY, description="policy retryable_errors")
            for i, s in enumerate(extra)]


EXCEPTION_RULE_PREFIX = "exception-class."
EXCEPTION_PRIORITY = 4  # below every hand-written rule: specific rules win


def _exception_rules(ruleset: RuleSet) -> list[Rule]:
    """One rule per category from the rule set's exception table (`exceptions:` in rule
    files): it matches a final exception line `pkg.mod.ClassName: message` of those
    classes. Its matches are named `exception.ClassName` (see Matcher._match)."""
    by_cat: dict[str, list[str]] = {}
    for name, cat in sorted(ruleset.exceptions.items()):
        by_cat.setdefault(cat, []).append(name)
    return [Rule(id=EXCEPTION_RULE_PREFIX + cat, category=cat, priority=EXCEPTION_PRIORITY,
                 regex=(exception_line_pattern(names),),
                 description="default by exception class (rule files' exceptions: table)")
            for cat, names in sorted(by_cat.items())]


def exception_line_pattern(names: Sequence[str]) -> str:
    """A final exception line of one of these classes: optional module path, the class,
    then `:`, `(` (Ray's `RayTaskError(RuntimeError)`) or the end of the line."""
    alts = "|".join(lit_escape(n) for n in sorted(names, key=lambda n: (-len(n), n)))
    return r"^\s?(?:[A-Za-z_]\w*\.)*(?:RayTaskError\()?(" + alts + r")(?::|\(|\)|$)"


class Matcher:
    """Matches lines and exit statuses against a rule set (stateless between batches)."""

    def __init__(self, ruleset: RuleSet, *, engine: str = "auto", native: bool = True):
        self.ruleset = ruleset
        # rules/_batchscan.c reads the lines' rank prefixes (_run_ranks) when built; `native`
        # False, or FAULTWATCH_NO_NATIVE=1, keeps the pure-Python reading (same results)
        self._native: Any = batchscan() if native else None
        exc_rules = _exception_rules(ruleset)
        self.rules: list[Rule] = [*exc_rules, *ruleset.rules, *_policy_rules(ruleset)]
        self._defaults = set(range(len(exc_rules)))  # rule indices of the exception table
        self._exc_name = regex.compile(exception_line_pattern(list(ruleset.exceptions))) \
            if ruleset.exceptions else None
        # higher priority first; on ties the later-defined rule wins (user files override)
        order = sorted(range(len(self.rules)), key=lambda i: (-self.rules[i].priority, -i))
        self._rank_of = {ri: k for k, ri in enumerate(order)}
        self.exit_rules = [self.rules[i] for i in order
                           if self.rules[i].exit_codes or self.rules[i].signals]
        pats: list[Pattern] = [Pattern(lit_escape(TB_START), MARK_BLOCK),
                               Pattern(lit_escape(CPP_START), MARK_BLOCK)]
        for ri, r in enumerate(self.rules):
            for c in r.contains:
                pats.append(Pattern(lit_escape(c), ri, r.ignore_case))
            for rx in r.regex:
                pats.append(Pattern(rx, ri, r.ignore_case))
        self.patterns = pats  # as written (confirmation, introspection, benchmarks)
        # the fast scan sees lines with their prefixes still on (no stripped copy of a batch
        # is made unless something matched): anchors also accept the end of a prefix
        # (LOOSE_ANCHOR, a superset), and two more patterns say where a line's prefixes may
        # name a rank, and where a rank prefix follows another character (stacked or merged);
        # the exact path scans stripped lines with the patterns as written
        scan_pats = [Pattern(anchor_after_prefix(p.source, LOOSE_ANCHOR), p.owner,
                             p.ignore_case) for p in pats]
        # per kind of rank carrier, "a run may start with one" and "one sits after other
        # text", each reported once per scan (a report per prefixed line cost a Python call
        # per line); where a line's rank is read is decided per batch (_fast_batch)
        self._pid_carrier = {k.name: len(pats) + i for i, k in enumerate(CARRIER_KINDS)}
        self._pid_mid = len(pats) + len(CARRIER_KINDS)
        scan_pats += [Pattern(k.carrier, MARK_PREFIX, single=True) for k in CARRIER_KINDS]
        scan_pats.append(Pattern(MID_PREFIX_PATTERN, MARK_PREFIX, single=True))
        # progress lines are common (every step), and only each rank's last one per batch
        # matters: they get their own database, scanned backwards in chunks (see _progress)
        self._e_ids = [i for i, p in enumerate(scan_pats)
                       if p.owner < 0 or self.rules[p.owner].kind != "progress"]
        self._p_ids = [i for i, p in enumerate(pats)
                       if p.owner >= 0 and self.rules[p.owner].kind == "progress"]
        self._owner = [p.owner for p in scan_pats]
        self.timeouts: Counter[str] = Counter()
        self._batch_timeouts: list[str] = []
        scan_e, pre_e, self.engine = build_scanner(
            [scan_pats[i] for i in self._e_ids], engine,
            lambda i: self._timed_out(self._e_ids[i]))
        self._scan = self._remap(scan_e, self._e_ids)
        # the fast path reads the scan's own ids (no remapped list per batch): the markers'
        self._scan_e_own: Any = scan_e
        e_pos = {g: e for e, g in enumerate(self._e_ids)}
        self._e_mid = e_pos[self._pid_mid]
        self._e_markers = frozenset(e_pos[g] for g in (*self._pid_carrier.values(),
                                                       self._pid_mid))
        self._e_kind = {e_pos[self._pid_carrier[k.name]]: k for k in CARRIER_KINDS}
        self._run_split = {k.name: re.compile(k.run, re.ASCII) for k in CARRIER_KINDS}
        self._kind_no = {k.name: i for i, k in enumerate(CARRIER_KINDS)}  # _batchscan's kinds
        self._token_search: dict[tuple[str, ...], re.Pattern[str]] = {}
        self._carrier_scan: Any = None  # a report per carrier: built when a batch needs it
        prefilter = {self._e_ids[i] for i in pre_e}
        self._x_ids = [i for i in self._e_ids if i < len(pats)]
        if any("^" in pats[i].source for i in self._x_ids):
            scan_x, pre_x, _ = build_scanner([pats[i] for i in self._x_ids], self.engine,
                                             lambda i: self._timed_out(self._x_ids[i]))
            self._scan_exact = self._remap(scan_x, self._x_ids)
            prefilter |= {self._x_ids[i] for i in pre_x}
        else:
            self._scan_exact = self._scan
        self._scan_p = self._scan_p_own = None
        if self._p_ids:
            scan_p, pre_p, _ = build_scanner([scan_pats[i] for i in self._p_ids], self.engine,
                                             lambda i: self._timed_out(self._p_ids[i]))
            self._scan_p = self._remap(scan_p, self._p_ids)
            self._scan_p_own = scan_p  # (_last_marks maps the ids of the hits it reads)
            prefilter |= {self._p_ids[i] for i in pre_p}
        flags = regex.IGNORECASE
        # exact confirmation with the regex module, for prefiltered ids and extractors
        self._confirm: dict[int, Any] = {
            pid: regex.compile(pats[pid].source, flags if pats[pid].ignore_case else 0)
            for pid in range(len(pats))
            if pid in prefilter or (pats[pid].owner >= 0
                                    and self.rules[pats[pid].owner].kind != "error"
                                    and pats[pid].source in self.rules[pats[pid].owner].regex)}
        self._prefilter = prefilter
        # an extractor's (step group, total group or None, rule id) for _mark: a match's groups
        # read by number (by name, a regex-module match takes ~1 us a group, ~2 us a dict);
        # (a pattern without a `step` group, which the loader refuses for progress rules,
        # keeps the name: reading it raises as it did)
        self._mark_groups: dict[int, tuple[int | str, int | None, str]] = {
            pid: (rx.groupindex.get("step", "step"), rx.groupindex.get("total"),
                  self.rules[pats[pid].owner].id if pats[pid].owner >= 0 else "")
            for pid, rx in self._confirm.items()}
        self._kind = [self.rules[p.owner].kind if p.owner >= 0 else "" for p in scan_pats]
        self._bytes = self.engine == "hyperscan"
        # the fast path handles batches where nothing but prefixes and progress hit; it needs
        # the markers reported once per batch (hyperscan; re2 would report every line)
        self._fast = self._bytes
        self._token_rank: dict[bytes, int] = {}  # b" 3: " -> 3 (run_rank_of)
        self._batch_text: tuple[list[str], str] = ([], "")  # the last batch's texts, joined
        self._batch_bytes: bytes | None = None
        # training-loss values (divergence), its own scan per batch (rules/loss.py); off with
        # the policy's divergence_detection: false
        self._losses = LossScanner(self.engine) \
            if ruleset.policy.get("divergence_detection", True) is not False else None

    def _timed_out(self, pid: int) -> None:
        """A regex-module search hit its timeout: never silent. Counted per rule id in
        `timeouts` and in the batch's MatchBatch.timeouts, logged once per rule."""
        owner = self._owner[pid] if pid < len(self._owner) else -1
        rid = self.rules[owner].id if owner >= 0 else "<marker>"
        if rid not in self.timeouts:
            log.warning("regex_timeout rule=%s timeout_s=%s (this rule's hits on such lines "
                        "are lost; later timeouts of it are only counted)", rid,
                        REGEX_TIMEOUT_S)
        self.timeouts[rid] += 1
        self._batch_timeouts.append(rid)

    @staticmethod
    def _remap(scan: Any, ids: list[int]) -> Any:
        def scan_global(data: str | bytes) -> list[tuple[int, int]]:
            return [(to, ids[pid]) for to, pid in scan(data)]
        return scan_global

    def _ends(self, texts: Sequence[str], joined: str) -> list[int]:
        """Where each text ends in `joined` (bytes for hyperscan), with C loops."""
        sizes: Any = map(len, texts)
        if self._bytes and not joined.isascii():
            sizes = (len(t.encode("utf-8", "replace")) for t in texts)
        return list(accumulate(map(add, sizes, repeat(1)), initial=-1))[1:]

    # -- exits ---------------------------------------------------------------
    def match_exit(self, exit_code: int, signal: int | None, ts: float) -> Match | None:
        """The best exit rule for an exit status (128+N or -N means killed by signal N)."""
        if signal is None:
            if exit_code > 128:
                signal = exit_code - 128
            elif exit_code < 0:
                signal = -exit_code
        for r in self.exit_rules:
            if exit_code in r.exit_codes or (signal is not None and signal in r.signals):
                desc = f"exit code {exit_code}" + (f" (signal {signal})" if signal else "")
                return Match(r.id, r.category or "unknown", r.cascade, ts, desc, None,
                             EXIT_STREAM, -1, r.effective_action)
        return None

    # -- lines ---------------------------------------------------------------
    def _confirmed(self, pid: int, text: str) -> bool:
        rx = self._confirm.get(pid)
        if rx is None or pid not in self._prefilter:
            return True
        try:
            return rx.search(text, *_SEARCH_ARGS) is not None
        except TimeoutError:
            self._timed_out(pid)
            return False

    def match_lines(self, lines: Sequence[Line], *,
                    default_rank: int | None = None) -> MatchBatch:
        """Rule hits, progress, stages and per-rank liveness of one batch of lines."""
        n = len(lines)
        if n == 0:
            return MatchBatch()
        self._batch_timeouts = []
        batch = self._match_lines(lines, default_rank)
        if self._batch_timeouts:
            batch = replace(batch, timeouts=tuple(self._batch_timeouts))
        if self._losses is not None:
            texts, joined = self._batch_text
            losses = self._losses.scan(lines, batch.ranks, default_rank, texts=texts,
                                       joined=joined, data=self._batch_bytes)
            if losses:
                batch = replace(batch, losses=losses)
        return batch

    def _match_lines(self, lines: Sequence[Line], default_rank: int | None) -> MatchBatch:
        texts: list[str] | None = getattr(lines, "texts", None)  # wire.LineRows has them
        if texts is None:
            texts = [ln.text for ln in lines]
        joined = "\n".join(texts)
        self._batch_text = (texts, joined)  # the loss scan reads the same batch (rules/loss.py)
        self._batch_bytes = None  # its UTF-8, when the fast path makes it
        # (times: where only a line's time is read, no Line is built: wire.LineRows)
        times = line_times(lines)
        if self._fast:
            fast = self._fast_batch(times, texts, joined, default_rank)
            if fast is not None:
                return fast
        return self._exact_batch(lines, times, texts, joined, default_rank)

    def _fast_batch(self, times: Sequence[float], texts: list[str], joined: str,
                    default_rank: int | None) -> MatchBatch | None:
        """The common case in one hyperscan pass over the batch as it came: no rule hit,
        only prefixes (and progress). None when the batch needs the exact path.

        Python works per batch and per hit that matters, not per line: the scan reports each
        kind of rank carrier once at most; the lines' ranks are then read by one regex split
        at the runs of one kind's tokens that start lines, and one search for tokens left
        after them (only the lines holding one are read in Python: _run_ranks). Batches that
        reading declines are read carrier by carrier (_carried_batch)."""
        n = len(texts)
        data = joined.encode("utf-8", "replace")
        self._batch_bytes = data  # the loss scan reuses it (rules/loss.py)
        hits = self._scan_e_own(data)
        fired = {pid for _, pid in hits} if hits else set()  # (rule hits are rare: few)
        if not fired.issubset(self._e_markers):
            return None  # a rule matched: the exact path names, groups and attributes it
        kinds = [k for e, k in self._e_kind.items() if e in fired]
        if not kinds:
            if self._e_mid in fired:
                return None  # a rank prefix in the middle of a line (merged output)
            progress = self._progress(times, texts, _same, None, default_rank, strip=True) \
                if self._scan_p else ()
            return MatchBatch((), progress, (), {default_rank: times[-1]},
                              (default_rank,) * n)
        # (a `[word3]:` token after other text is looked for too: merged output, or a run)
        search = kinds if self._e_mid not in fired or kinds[0].name == "rank" else \
            [CARRIER_KINDS[0], *kinds]
        # (the native reading takes every kind; the Python split declines srun labels, for
        # speed: their token search has no literal to skip to)
        ranks = self._run_ranks(kinds, search, texts, joined, default_rank) \
            if self._native is not None or all(k.split for k in kinds) else None
        if ranks is None:
            return self._carried_batch(times, texts, data, joined, default_rank)
        return self._ranked_batch(times, texts, ranks)

    def _run_ranks(self, kinds: list[CarrierKind], search: list[CarrierKind],
                   texts: list[str], joined: str, default_rank: int | None
                   ) -> list[int | None] | None:
        """Each line's rank (normalise_line's) when the scan saw carriers of `kinds`: the
        first kind whose tokens start lines is read by one split (a line's run of them, the
        innermost token's rank); a line holding a token of the `search` kinds past that run (stacked
        behind other prefixes, mixed launchers, a lookalike in the text) is read alone with
        the full prefix grammar; lines with neither keep `default_rank`. None when a line
        holds a newline, no kind starts a line, or a `[word3]:` token sits past a line's run
        of prefixes (merged output: the exact path splits that line). With the native module
        (rules/_batchscan.c) the split and the search are one C pass over the batch."""
        n = len(texts)
        found: list[tuple[int, int, bool]]
        if self._native is not None:
            if joined.count("\n") != n - 1:
                return None  # a line holding a newline
            read = self._native.run_ranks(
                joined, tuple(self._kind_no[kd.name] for kd in kinds),
                sum({1 << self._kind_no[kd.name] for kd in search}), default_rank)
            if read is None:
                return None  # carriers only behind other prefixes: read one by one
            ranks, found = read
        else:
            split = self._split_ranks(kinds, search, texts, joined, default_rank)
            if split is None:
                return None
            ranks, found = split
        if found and not self._reread(texts, found, ranks, default_rank):
            return None
        return ranks

    def _split_ranks(self, kinds: list[CarrierKind], search: list[CarrierKind],
                     texts: list[str], joined: str, default_rank: int | None
                     ) -> tuple[list[int | None], list[tuple[int, int, bool]]] | None:
        """_run_ranks' reading in pure Python: (each line's rank from its run, the tokens
        past the runs as (line, where the token ends in the line's text, is it a `[word3]:`
        token)), or None (no kind starts a line, or a line holds a newline)."""
        n = len(texts)
        for kind in kinds:
            parts = self._run_split[kind.name].split("\n" + joined)
            if len(parts) > 1:
                break
        else:
            return None  # carriers only behind other prefixes: read one by one
        caps = parts[1::2]
        k = len(caps)
        pieces = parts[0::2]
        nl = list(accumulate(map(str.count, pieces, repeat("\n"))))
        if nl[-1] != n - k:
            return None  # a line holding a newline
        rks: list[int | None] = list(map(int, caps))
        if k == n:
            ranks = rks
        else:
            ranks = [default_rank] * n
            list(map(ranks.__setitem__, map(add, nl, range(k)), rks))  # run j: line nl[j]+j
        key = tuple(kd.name for kd in search)
        rx = self._token_search.get(key)
        if rx is None:
            rx = self._token_search[key] = re.compile(
                "|".join(kd.token for kd in search), re.ASCII)
        rest = "\n".join(pieces)  # the batch past the runs read, after a leading newline
        spans = [m.span() for m in rx.finditer(rest)]  # (ascending)
        if not spans:
            return ranks, []
        starts = list(map(add, map(rest.rfind, repeat("\n"), repeat(0),
                                   [a for a, _ in spans]), repeat(1)))
        line = list(accumulate(map(rest.count, repeat("\n"), [0, *starts[:-1]], starts)))
        found: list[tuple[int, int, bool]] = []
        for (a, b), r0, ln in zip(spans, starts, line, strict=True):
            i = ln - 1
            r1 = rest.find("\n", a)
            cut = len(texts[i]) - ((len(rest) if r1 < 0 else r1) - r0) + (b - r0)
            found.append((i, cut, _RANK_TOKEN.match(rest, a) is not None))
        return ranks, found

    def _reread(self, texts: list[str], found: list[tuple[int, int, bool]],
                ranks: list[int | None], default_rank: int | None) -> bool:
        """Ranks of the lines holding a carrier's token past their run read by the split
        (`found`: line, where the token ends in its text, is it a `[word3]:` token), as
        _carried_ranks reads carriers: the line's start up to each token's end, once per
        distinct text (cached), is a run of prefixes naming a rank (the innermost: a later
        token's overrides), a run naming none (the line read alone), or no run (a lookalike
        in the text; a `[word3]:` one means merged output: False, the exact path splits the
        line)."""
        known = self._token_rank
        alone: set[int] = set()
        for i, cut, rank_token in found:
            tok = texts[i][:cut].encode("utf-8", "replace")
            r = known.get(tok)
            if r is None:
                r = run_rank_of(tok)
                if len(tok) <= 128:  # (long runs are not kept, as in _carried_ranks)
                    if len(known) >= 4096:
                        known.clear()
                    known[tok] = r
            if r >= 0:
                ranks[i] = r
            elif r == NOT_A_RUN:
                if rank_token:
                    return False  # a `[word3]:` token past the line's run: merged output
            else:
                alone.add(i)
        if alone:
            at = sorted(alone)
            for i, rank in zip(at, line_ranks([texts[i] for i in at], default_rank),
                               strict=True):
                ranks[i] = rank
        return True

    def _ranked_batch(self, times: Sequence[float], texts: list[str],
                      ranks: list[int | None]) -> MatchBatch:
        """The fast path's result once each line's rank is known."""
        last_ts = {r: times[i] for r, i in _last_index(ranks).items()}
        one = len(last_ts) == 1
        progress = self._progress(times, texts, _same, None if one else ranks, ranks[0],
                                  strip=True) if self._scan_p else ()
        return MatchBatch((), progress, (), last_ts, tuple(ranks))

    def carrier_hits(self, data: bytes) -> tuple[list[int], list[int]]:
        """(where a rank-carrying prefix may end, where a `[word3]:` token after another
        character ends) in `data`: a report per carrier, for the batches _run_ranks cannot
        read (the scanner is compiled the first time one comes)."""
        if self._carrier_scan is None:
            self._carrier_scan = build_scanner(
                [Pattern(RANK_CARRIER_PATTERN, 0), Pattern(MID_PREFIX_PATTERN, 1)],
                self.engine)[0]
        hits = self._carrier_scan(data)
        if not hits:
            return [], []
        tos, pids = zip(*hits, strict=True)
        return list(compress(tos, map((0).__eq__, pids))), \
            list(compress(tos, map((1).__eq__, pids)))

    def _carried_batch(self, times: Sequence[float], texts: list[str], data: bytes,
                       joined: str, default_rank: int | None) -> MatchBatch | None:
        """_fast_batch() carrier by carrier: each line's rank from the runs of prefixes up to
        its carriers (Python per prefixed line). None when the exact path must split lines."""
        carried, mid = self.carrier_hits(data)
        if not carried:
            return None  # (the batch scan saw one: an engine difference; be exact)
        carried_ranks = self._carried_ranks(texts, data, len(data) == len(joined), carried,
                                            default_rank)
        if carried_ranks is None:
            return None  # a prefix after a newline inside a line: the exact path splits it
        ranks, in_runs = carried_ranks
        if mid and not in_runs.issuperset(mid):
            return None  # a rank prefix after a line's prefixes (merged output)
        return self._ranked_batch(times, texts, ranks)

    def _carried_ranks(self, texts: list[str], data: bytes, ascii_only: bool,
                       carried: list[int], default_rank: int | None
                       ) -> tuple[list[int | None], set[int]] | None:
        """Each line's rank, given where rank-carrying prefixes may end (`carried`, offsets
        in `data`): the line's text up to there is read as a run of prefixes once per
        distinct text (a cache: `[rank3]:`, ` 3: `, `[Rank 3] `...); the innermost one per
        line wins; a text that is no such run is a lookalike after the line's run (ignored).
        Also the offsets of `carried` that end a line's run of prefixes (stacked ones). None
        when a line holds a newline with a prefix after it (the exact path splits it)."""
        n = len(texts)
        if len(carried) == n and data.count(b"\n") == n - 1:
            one = self._one_carrier_per_line(data, carried)
            if one is not None:
                return one
        sizes: Any = map(len, texts) if ascii_only else \
            [len(t.encode("utf-8", "replace")) for t in texts]
        ends = list(accumulate(map(add, sizes, repeat(1))))  # one past each line's "\n"
        line_of = list(map(bisect_left, repeat(ends), carried))
        starts = [0, *ends]
        toks = list(map(data.__getitem__, map(slice, map(starts.__getitem__, line_of),
                                                carried)))
        known = self._token_rank
        new = set(toks).difference(known)
        if new and len(known) + len(new) > 4096:
            known.clear()
            new = set(toks)
        local: dict[bytes, int] = {}
        for tok in new:
            r = _HELD_NEWLINE if b"\n" in tok else run_rank_of(tok)
            (known if r != _HELD_NEWLINE and len(tok) <= 128 else local)[tok] = r
        # -1: a run naming no rank (a carrier read as another kind): its line goes to
        # line_ranks; NOT_A_RUN: a lookalike after other text, not part of the line's run
        rks = cast(list[int], list(map(known.get, toks, map(local.get, toks))))
        if _HELD_NEWLINE in rks:
            return None
        good = list(map((0).__le__, rks))
        in_runs = set(compress(carried, map(NOT_A_RUN.__lt__, rks)))
        ranks: list[int | None] = [default_rank] * n
        # (per carrier, not per line; a line's later carrier overwrites: the innermost wins)
        list(map(ranks.__setitem__, compress(line_of, good), compress(rks, good)))
        slow = list(compress(line_of, map((-1).__eq__, rks)))
        if slow:
            at = sorted(set(slow))
            for i, rank in zip(at, line_ranks(list(map(texts.__getitem__, at)), default_rank),
                               strict=True):
                ranks[i] = rank
        return ranks, in_runs

    def _one_carrier_per_line(self, data: bytes, carried: list[int]
                              ) -> tuple[list[int | None], set[int]] | None:
        """_carried_ranks() when no line holds a newline and there are as many carriers as
        lines: each line's start found back from its carrier (a C loop, no bisect), and when
        those starts are the lines' own, in order, and every run names a rank, those ranks
        are the lines' (each line's run is the one carrier). None otherwise."""
        starts = list(map(add, map(data.rfind, repeat(b"\n"), repeat(0), carried), repeat(1)))
        if len(set(starts)) != len(starts) or starts != sorted(starts):
            return None  # two carriers on one line (stacked), so some line without
        toks = list(map(data.__getitem__, map(slice, starts, carried)))
        known = self._token_rank
        new = set(toks).difference(known)
        if new:
            if max(map(len, new)) > 128:
                return None  # (long runs are not kept: the general reading)
            if len(known) + len(new) > 4096:
                known.clear()
                new = set(toks)
            for tok in new:
                known[tok] = run_rank_of(tok)  # (no newline in a token: none in the data)
        rks: list[int | None] = list(map(known.__getitem__, toks))
        if min(cast(list[int], rks)) < 0:
            return None  # a run naming no rank, or a lookalike: the general reading
        return rks, set(carried)

    def _exact_batch(self, lines: Sequence[Line], times: Sequence[float], texts: list[str],
                     joined: str, default_rank: int | None) -> MatchBatch:
        """Prefixes stripped, merged lines split, every hit confirmed and attributed."""
        parts = self._segments(lines, texts, default_rank, joined)
        joined, seg_text, seg_rank, seg_line, ranks, by_rank = parts
        last_ts = {r: times[idx[-1] if seg_line is None else seg_line[idx[-1]]]
                   for r, idx in by_rank.items()}
        lidx: Any = _same if seg_line is None else seg_line.__getitem__
        one = len(by_rank) == 1  # (one rank: no per-text ranks needed)
        progress = self._progress(times, seg_text, lidx, None if one else seg_rank,
                                  next(iter(by_rank))) if self._scan_p else ()
        hits = [h for h in self._scan_exact(joined) if self._owner[h[1]] != MARK_PREFIX]
        if not hits:
            return MatchBatch((), progress, (), last_ts, ranks)
        ends = self._ends(seg_text, joined)
        kind = self._kind
        err: dict[int, list[int]] = {}
        stage_hits: list[tuple[int, int]] = []
        starts: list[int] = []
        for to, pid in hits:
            seg = bisect_left(ends, to)
            k = kind[pid]
            if k == "error":
                err.setdefault(seg, []).append(pid)
            elif k == "stage":
                stage_hits.append((seg, pid))
            else:
                starts.append(seg)
        matches = self._errors(lines, seg_text, seg_rank, lidx, err, starts) if err else ()
        stages = self._stages(times, seg_text, seg_rank, lidx, stage_hits) if stage_hits else ()
        return MatchBatch(matches, progress, stages, last_ts, ranks)

    @staticmethod
    def _segments(lines: Sequence[Line], texts: list[str], default_rank: int | None,
                  joined: str) -> tuple[str, list[str], list[int | None], list[int] | None,
                             tuple[int | None, ...], dict[int | None, Sequence[int]]]:
        """(joined, segment texts, segment ranks, segment -> line or None when 1:1, line
        ranks, segment indices per rank): rank prefixes stripped, merged lines split."""
        n = len(texts)
        batch = normalise_batch(joined, n, default_rank)
        if batch is None:  # merged lines, or a line holding a newline: line by line
            return Matcher._normalised_segments(texts, default_rank)
        stripped, seg_rank = batch
        per_rank = dict(zip(seg_rank, repeat(None)))
        if len(per_rank) == 1:
            return (stripped, texts if stripped == joined else stripped.split("\n"), seg_rank,
                    None, tuple(seg_rank), {seg_rank[0]: range(n)})
        by_rank: dict[int | None, list[int]] = {}
        for i, r in enumerate(seg_rank):
            idx = by_rank.get(r)
            if idx is None:
                by_rank[r] = [i]
            else:
                idx.append(i)
        return (stripped, stripped.split("\n"), seg_rank, None, tuple(seg_rank),
                dict(by_rank))

    @staticmethod
    def _normalised_segments(texts: list[str], default_rank: int | None
                             ) -> tuple[str, list[str], list[int | None], list[int] | None,
                                        tuple[int | None, ...],
                                        dict[int | None, Sequence[int]]]:
        """_segments() for batches with prefixes other than `[rank3]:` (timestamps, stream
        tags, srun labels, Ray, syslog...): each line normalised, then split where a rank
        prefix sits in its middle."""
        seg_text: list[str] = []
        seg_rank: list[int | None] = []
        seg_line: list[int] = []
        line_rank: list[int | None] = []
        by_rank: dict[int | None, list[int]] = {}
        for i, t in enumerate(texts):
            segs = split_line(t, default_rank)
            line_rank.append(segs[0][0])
            for r, st in segs:
                by_rank.setdefault(r, []).append(len(seg_text))
                seg_text.append(st)
                seg_rank.append(r)
                seg_line.append(i)
        return ("\n".join(seg_text), seg_text, seg_rank, seg_line, tuple(line_rank),
                dict(by_rank))

    def _best(self, pids: list[int], line: Line, text: str,
              defaults: bool = True) -> Rule | None:
        best: Rule | None = None
        best_k = 1 << 30
        for pid in pids:
            ri = self._owner[pid]
            if not defaults and ri in self._defaults:
                continue
            r = self.rules[ri]
            if r.stream is not None and r.stream != line.stream:
                continue
            k = self._rank_of[ri]
            if k < best_k and self._confirmed(pid, text):
                best, best_k = r, k
        return best

    def _errors(self, lines: Sequence[Line], texts: list[str], ranks: list[int | None],
                lidx: Any, err: dict[int, list[int]], starts: list[int]) -> tuple[Match, ...]:
        blocks: list[Block] = find_blocks(texts, ranks, sorted(set(starts))) if starts else []
        in_block: dict[int, Block] = {m: b for b in blocks for m in b.members}
        out: list[tuple[int, Match]] = []
        done: set[int] = set()
        for seg in sorted(err):
            blk = in_block.get(seg)
            if blk is None:
                ln = lines[lidx(seg)]
                r = self._best(err[seg], ln, texts[seg])
                if r is not None:
                    out.append((seg, self._match(r, ln, texts[seg], ranks[seg], ())))
                continue
            if id(blk) in done:
                continue
            done.add(id(blk))
            # the final exception line first, then earlier chained ones, then any line; the
            # exception-class table only when no rule matched any line of the block
            order = [*reversed(blk.finals), *(m for m in reversed(blk.members)
                                              if m not in blk.finals)]
            found = None
            for defaults in (False, True):
                for s in order:
                    if s not in err:
                        continue
                    r = self._best(err[s], lines[lidx(s)], texts[s], defaults)
                    if r is not None:
                        found = (r, s)
                        break
                if found is not None or not self._defaults:
                    break
            if found is not None:
                r, s = found
                rep = blk.report if blk.report is not None else s
                ctx = tuple(texts[m] for m in blk.members[-CONTEXT_LINES:])
                if r.id.startswith(EXCEPTION_RULE_PREFIX):
                    rep = s  # the class named is that line's
                out.append((rep, self._match(r, lines[lidx(rep)], texts[rep], ranks[rep], ctx)))
        out.sort(key=lambda x: x[0])
        return tuple(m for _, m in out)

    def _match(self, r: Rule, ln: Line, text: str, rank: int | None,
               ctx: tuple[str, ...]) -> Match:
        rid = r.id
        if rid.startswith(EXCEPTION_RULE_PREFIX) and self._exc_name is not None:
            m = self._exc_name.search(text)
            if m is not None:
                rid = "exception." + m.group(1)  # where the verdict came from
        return Match(rid, r.category or "unknown", r.cascade, ln.ts, text, rank, ln.stream,
                     ln.seq, r.effective_action, ctx)

    def _extract(self, pid: int, text: str) -> Any:
        rx = self._confirm.get(pid)
        if rx is None:
            return None
        try:
            return rx.search(text, *_SEARCH_ARGS)
        except TimeoutError:
            self._timed_out(pid)
            return None

    def _progress(self, times: Sequence[float], texts: list[str], lidx: Any,
                  ranks: Sequence[int | None] | None, default_rank: int | None, *,
                  strip: bool = False) -> tuple[ProgressMark, ...]:
        """Each rank's last step in the batch (`ranks`: each text's rank, None when all are
        `default_rank`; `strip`: the texts still carry their prefixes). Scans backwards in
        windows, each over the lines of the ranks still without a step: the batch's last
        PROGRESS_TAIL lines, then PROGRESS_TAIL per rank, then the rest (three at most)."""
        assert self._scan_p is not None
        n = len(texts)
        present = {default_rank} if ranks is None else set(ranks)
        out: list[tuple[int, ProgressMark]] = []
        found: set[int | None] = set()
        hi = n
        for lo in sorted({max(0, n - PROGRESS_TAIL), max(0, n - PROGRESS_TAIL * len(present)),
                          0}, reverse=True):
            if lo >= hi:
                continue
            pending = present - found
            segs: Sequence[int] = range(lo, hi) if ranks is None or pending == present else \
                list(compress(range(lo, hi), map(pending.__contains__, ranks[lo:hi])))
            if segs:
                self._last_marks(times, texts, lidx, ranks, default_rank, segs, found, out,
                                 strip)
            if len(found) == len(present):
                break
            hi = lo
        out.sort(key=itemgetter(0))
        return tuple(p for _, p in out)

    def _last_marks(self, times: Sequence[float], texts: list[str], lidx: Any,
                    ranks: Sequence[int | None] | None, default_rank: int | None,
                    segs: Sequence[int], found: set[int | None],
                    out: list[tuple[int, ProgressMark]], strip: bool) -> None:
        """The latest step among `segs` (ascending text indices) of each rank not `found`
        yet: one scan over those texts, then work per hit, latest first."""
        assert self._scan_p_own is not None
        chunk = texts[segs.start:segs.stop] if isinstance(segs, range) else \
            list(map(texts.__getitem__, segs))
        joined = "\n".join(chunk)
        hits = self._scan_p_own(joined)
        if not hits:
            return
        ends = self._ends(chunk, joined)
        ids = self._p_ids  # ascending: the scan's own ids sort as the global ones
        for to, own in sorted(hits, reverse=True):
            seg = segs[bisect_left(ends, to)]
            rank = default_rank if ranks is None else ranks[seg]
            if rank in found:
                continue
            text = strip_prefixes(texts[seg]) if strip else texts[seg]
            mark = self._mark(ids[own], text, rank, times[lidx(seg)])
            if mark is not None:
                out.append((seg, mark))
                found.add(rank)

    def _mark(self, pid: int, text: str, rank: int | None, ts: float) -> ProgressMark | None:
        m = self._extract(pid, text)
        if m is None:
            return None
        step_g, total_g, rule_id = self._mark_groups[pid]
        step_s, total_s = m[step_g], None if total_g is None else m[total_g]
        if step_s is None:
            return None
        try:
            step = int(step_s)
            total = int(total_s) if total_s else None
        except ValueError:
            return None
        return ProgressMark(rank, ts, step, total, rule_id)

    def _stages(self, times: Sequence[float], texts: list[str], ranks: list[int | None],
                lidx: Any, hits: list[tuple[int, int]]) -> tuple[StageMark, ...]:
        out: list[StageMark] = []
        seen: set[int] = set()
        for seg, pid in sorted(hits):
            if seg in seen:
                continue
            r = self.rules[self._owner[pid]]
            m = self._extract(pid, texts[seg]) if pid in self._confirm else None
            if pid in self._confirm and m is None:
                continue
            seen.add(seg)
            out.append(StageMark(ranks[seg], times[lidx(seg)], r.stage or r.id, r.opens,
                                 r.hang_window_s, r.id, _step_of(m)))
        return tuple(out)

    # -- introspection (rule tests, explain) ---------------------------------
    def rules_matching(self, text: str) -> list[tuple[Rule, Any]]:
        """Every rule matching one line (prefix stripped), with the extractor match if any."""
        segs = split_line(text, None)
        out: list[tuple[Rule, Any]] = []
        seen: set[int] = set()
        for _rank, seg in segs:
            hits = self._scan_exact(seg) + (self._scan_p(seg) if self._scan_p else [])
            for _to, pid in hits:
                ri = self._owner[pid]
                if ri < 0 or ri in seen:
                    continue
                r = self.rules[ri]
                if r.kind == "error":
                    if self._confirmed(pid, seg):
                        seen.add(ri)
                        out.append((r, None))
                    continue
                m = self._extract(pid, seg) if pid in self._confirm else True
                if m is not None:
                    seen.add(ri)
                    out.append((r, m))
        return out


def _same(i: int) -> int:
    return i


def _step_of(m: Any) -> int | None:
    """A stage line's `step` group (a checkpoint's step), when its pattern has one."""
    if m is None or m is True or "step" not in m.re.groupindex:
        return None
    s = m.group("step")
    try:
        return int(s) if s else None
    except ValueError:
        return None


def _last_index(ranks: list[int | None]) -> dict[int | None, int]:
    """dict(zip(ranks, range(len(ranks)))) (each rank's last index, the ranks in the order
    they first appear) with one C loop per rank instead of an entry per line."""
    firsts = dict.fromkeys(ranks)
    if len(firsts) > 16:
        return dict(zip(ranks, range(len(ranks)), strict=True))
    back = ranks[::-1]
    last = len(ranks) - 1
    return {r: last - back.index(r) for r in firsts}


def split_line(text: str, default_rank: int | None) -> list[tuple[int | None, str]]:
    """Segments (rank, text) of one physical line: its prefixes stripped (normalise.py),
    then split where a rank prefix sits in its middle (two ranks' output merged)."""
    norm = normalise_line(text, default_rank)
    t = norm.text
    m = PREFIX_RE.search(t) if "[" in t else None
    if m is None:
        return [(norm.rank, t)]
    if m.start() == 0:
        return split_prefixed(t, norm.rank)
    return [(norm.rank, t[:m.start()]), *split_prefixed(t[m.start():], norm.rank)]
