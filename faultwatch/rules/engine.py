"""The Matcher: scans batches of lines with one multi-pattern database and builds matches."""

from __future__ import annotations

import logging
from bisect import bisect_left
from collections import Counter
from collections.abc import Sequence
from dataclasses import replace
from itertools import accumulate, compress, repeat
from operator import add, itemgetter
from typing import Any

import regex

from faultwatch.core.events import EXIT_STREAM, Line, Match, line_times
from faultwatch.rules.loss import LossScanner
from faultwatch.rules.model import MatchBatch, ProgressMark, Rule, RuleSet, StageMark
from faultwatch.rules.native import fast_path
from faultwatch.rules.normalise import normalise_batch, normalise_line
from faultwatch.rules.patterns import (
    LOOSE_ANCHOR,
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
USER_PRIORITY = 100
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
        # the progress scan sees stripped lines with every `^` loosened (LOOSE_ANCHOR: a
        # superset, as it always did; each hit is confirmed with the pattern as written)
        scan_pats = [Pattern(anchor_after_prefix(p.source, LOOSE_ANCHOR), p.owner,
                             p.ignore_case) for p in pats]
        # progress lines are common (every step), and only each rank's last one per batch
        # matters: they get their own database, scanned backwards in chunks (see _progress)
        self._e_ids = [i for i, p in enumerate(pats)
                       if p.owner < 0 or self.rules[p.owner].kind != "progress"]
        self._p_ids = [i for i, p in enumerate(pats)
                       if p.owner >= 0 and self.rules[p.owner].kind == "progress"]
        self._owner = [p.owner for p in pats]
        self.timeouts: Counter[str] = Counter()
        self._batch_timeouts: list[str] = []
        scan_x, pre_x, self.engine = build_scanner(
            [pats[i] for i in self._e_ids], engine, lambda i: self._timed_out(self._e_ids[i]))
        self._scan_exact = self._remap(scan_x, self._e_ids)
        prefilter = {self._e_ids[i] for i in pre_x}
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
        self._kind = [self.rules[p.owner].kind if p.owner >= 0 else "" for p in pats]
        self._bytes = self.engine == "hyperscan"
        # the native fast path (rules/native.py): a batch no rule hits, in one call
        self.fast = fast_path(pats, scan_pats, self._p_ids, prefilter, self.engine) \
            if native else None
        self._scan_x_own: Any = scan_x  # (the fast path asks only whether anything hit)
        self._mark_rule = [self._mark_groups[pid][2] for pid in self._p_ids]
        self._batch_text: tuple[list[str], str] = ([], "")  # the last batch's texts, joined
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
                                       joined=joined)
            if losses:
                batch = replace(batch, losses=losses)
        return batch

    def _match_lines(self, lines: Sequence[Line], default_rank: int | None) -> MatchBatch:
        texts: list[str] | None = getattr(lines, "texts", None)  # wire.LineRows has them
        if texts is None:
            texts = [ln.text for ln in lines]
        joined = "\n".join(texts)
        self._batch_text = (texts, joined)  # the loss scan reads the same batch (rules/loss.py)
        # (times: where only a line's time is read, no Line is built: wire.LineRows)
        times = line_times(lines)
        if self.fast is not None:
            got = self.fast.scan(texts, times, default_rank)
            # (the stripped lines scanned for rules as the exact path scans them: a hit, or
            # a traceback's start, and the exact path reads the batch)
            if got is not None and not self._scan_x_own(got[0]):
                _, ranks, last, marks = got
                rule = self._mark_rule
                return MatchBatch((), tuple(ProgressMark(r, ts, step, total, rule[k])
                                            for _, r, ts, step, total, k in marks),
                                  (), dict(last), tuple(ranks))
        return self._exact_batch(lines, times, texts, joined, default_rank)

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
        hits = self._scan_exact(joined)
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
                  ranks: Sequence[int | None] | None, default_rank: int | None
                  ) -> tuple[ProgressMark, ...]:
        """Each rank's last step in the batch (`ranks`: each text's rank, None when all are
        `default_rank`). Scans backwards in
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
                self._last_marks(times, texts, lidx, ranks, default_rank, segs, found, out)
            if len(found) == len(present):
                break
            hi = lo
        out.sort(key=itemgetter(0))
        return tuple(p for _, p in out)

    def _last_marks(self, times: Sequence[float], texts: list[str], lidx: Any,
                    ranks: Sequence[int | None] | None, default_rank: int | None,
                    segs: Sequence[int], found: set[int | None],
                    out: list[tuple[int, ProgressMark]]) -> None:
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
            mark = self._mark(ids[own], texts[seg], rank, times[lidx(seg)])
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
