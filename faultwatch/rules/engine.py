"""The Matcher: scans batches of lines with one multi-pattern database and builds matches."""

from __future__ import annotations

import logging
from bisect import bisect_left
from collections.abc import Sequence
from itertools import accumulate
from typing import Any

import regex

from faultwatch.core.events import EXIT_STREAM, Line, Match
from faultwatch.rules.model import MatchBatch, ProgressMark, Rule, RuleSet, StageMark
from faultwatch.rules.patterns import Pattern, build_scanner, lit_escape
from faultwatch.rules.prefix import split_prefixed
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


def _policy_rules(ruleset: RuleSet) -> list[Rule]:
    extra = ruleset.policy.get("retryable_errors") or []
    assert isinstance(extra, list)
    return [Rule(id=f"policy.retryable_errors.{i}", category="retryable", contains=(s,),
                 priority=USER_PRIORITY, description="policy retryable_errors")
            for i, s in enumerate(extra)]


class Matcher:
    """Matches lines and exit statuses against a rule set (stateless between batches)."""

    def __init__(self, ruleset: RuleSet, *, engine: str = "auto"):
        self.ruleset = ruleset
        self.rules: list[Rule] = [*ruleset.rules, *_policy_rules(ruleset)]
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
        self.patterns = pats
        self._scan, prefilter, self.engine = build_scanner(pats, engine)
        flags = regex.IGNORECASE
        # exact confirmation with the regex module, for prefiltered ids and extractors
        self._confirm: dict[int, Any] = {
            pid: regex.compile(pats[pid].source, flags if pats[pid].ignore_case else 0)
            for pid in range(len(pats))
            if pid in prefilter or (pats[pid].owner >= 0
                                    and self.rules[pats[pid].owner].kind != "error"
                                    and pats[pid].source in self.rules[pats[pid].owner].regex)}
        self._prefilter = prefilter
        self._owner = [p.owner for p in pats]
        self._kind = [self.rules[p.owner].kind if p.owner >= 0 else "" for p in pats]
        self._bytes = self.engine == "hyperscan"

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
            return rx.search(text, timeout=REGEX_TIMEOUT_S) is not None
        except TimeoutError:
            return False

    def match_lines(self, lines: Sequence[Line], *,
                    default_rank: int | None = None) -> MatchBatch:
        """Rule hits, progress, stages and per-rank liveness of one batch of lines."""
        n = len(lines)
        if n == 0:
            return MatchBatch()
        texts = [ln.text for ln in lines]
        joined = "\n".join(texts)
        seg_line: list[int] | None = None
        if joined.startswith("[") or "\n[" in joined:
            seg_text: list[str] = []
            seg_rank: list[int | None] = []
            seg_line = []
            line_rank: list[int | None] = []
            last_ts: dict[int | None, float] = {}
            for i, t in enumerate(texts):
                if t.startswith("["):
                    segs = split_prefixed(t, default_rank)
                else:
                    segs = [(default_rank, t)]
                line_rank.append(segs[0][0])
                for r, st in segs:
                    seg_text.append(st)
                    seg_rank.append(r)
                    seg_line.append(i)
                    last_ts[r] = lines[i].ts
            joined = "\n".join(seg_text)
            ranks = tuple(line_rank)
        else:
            seg_text = texts
            seg_rank = [default_rank] * n
            ranks = tuple(seg_rank)
            last_ts = {default_rank: lines[-1].ts}
        hits = self._scan(joined)
        if not hits:
            return MatchBatch((), (), (), last_ts, ranks)
        if self._bytes and not joined.isascii():
            ends = list(accumulate(len(t.encode("utf-8", "replace")) + 1 for t in seg_text))
        else:
            ends = list(accumulate(len(t) + 1 for t in seg_text))
        ends = [e - 1 for e in ends]
        owner, kind = self._owner, self._kind
        err: dict[int, list[int]] = {}
        progress_last: dict[int | None, list[tuple[int, int]]] = {}
        stage_hits: list[tuple[int, int]] = []
        starts: list[int] = []
        for to, pid in hits:
            seg = bisect_left(ends, to)
            k = kind[pid]
            if k == "error":
                err.setdefault(seg, []).append(pid)
            elif k == "progress":
                progress_last.setdefault(seg_rank[seg], []).append((seg, pid))
            elif k == "stage":
                stage_hits.append((seg, pid))
            else:
                starts.append(seg)
        lidx = (lambda s: s) if seg_line is None else seg_line.__getitem__
        matches = self._errors(lines, seg_text, seg_rank, lidx, err, starts) if err else ()
        progress = self._progress(lines, seg_text, lidx, progress_last) if progress_last else ()
        stages = self._stages(lines, seg_text, seg_rank, lidx, stage_hits) if stage_hits else ()
        return MatchBatch(matches, progress, stages, last_ts, ranks)

    def _best(self, pids: list[int], line: Line, text: str) -> Rule | None:
        best: Rule | None = None
        best_k = 1 << 30
        for pid in pids:
            ri = self._owner[pid]
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
            # the final exception line first, then earlier chained ones, then any line
            order = [*reversed(blk.finals), *(m for m in reversed(blk.members)
                                              if m not in blk.finals)]
            for s in order:
                if s not in err:
                    continue
                r = self._best(err[s], lines[lidx(s)], texts[s])
                if r is None:
                    continue
                rep = blk.report if blk.report is not None else s
                ctx = tuple(texts[m] for m in blk.members[-CONTEXT_LINES:])
                out.append((rep, self._match(r, lines[lidx(rep)], texts[rep], ranks[rep], ctx)))
                break
        out.sort(key=lambda x: x[0])
        return tuple(m for _, m in out)

    @staticmethod
    def _match(r: Rule, ln: Line, text: str, rank: int | None,
               ctx: tuple[str, ...]) -> Match:
        return Match(r.id, r.category or "unknown", r.cascade, ln.ts, text, rank, ln.stream,
                     ln.seq, r.effective_action, ctx)

    def _extract(self, pid: int, text: str) -> Any:
        rx = self._confirm.get(pid)
        if rx is None:
            return None
        try:
            return rx.search(text, timeout=REGEX_TIMEOUT_S)
        except TimeoutError:
            return None

    def _progress(self, lines: Sequence[Line], texts: list[str], lidx: Any,
                  per_rank: dict[int | None, list[tuple[int, int]]]
                  ) -> tuple[ProgressMark, ...]:
        out: list[tuple[int, ProgressMark]] = []
        for rank, cands in per_rank.items():
            for seg, pid in reversed(cands[-8:]):  # the rank's latest step in the batch
                m = self._extract(pid, texts[seg])
                if m is None or m.group("step") is None:
                    continue
                gd = m.groupdict()
                try:
                    step = int(gd["step"])
                    total = int(gd["total"]) if gd.get("total") else None
                except ValueError:
                    continue
                ln = lines[lidx(seg)]
                out.append((seg, ProgressMark(rank, ln.ts, step, total,
                                              self.rules[self._owner[pid]].id)))
                break
        out.sort(key=lambda x: x[0])
        return tuple(p for _, p in out)

    def _stages(self, lines: Sequence[Line], texts: list[str], ranks: list[int | None],
                lidx: Any, hits: list[tuple[int, int]]) -> tuple[StageMark, ...]:
        out: list[StageMark] = []
        seen: set[int] = set()
        for seg, pid in sorted(hits):
            if seg in seen:
                continue
            r = self.rules[self._owner[pid]]
            if pid in self._confirm and self._extract(pid, texts[seg]) is None:
                continue
            seen.add(seg)
            out.append(StageMark(ranks[seg], lines[lidx(seg)].ts, r.stage or r.id, r.opens,
                                 r.hang_window_s, r.id))
        return tuple(out)

    # -- introspection (rule tests, explain) ---------------------------------
    def rules_matching(self, text: str) -> list[tuple[Rule, Any]]:
        """Every rule matching one line (prefix stripped), with the extractor match if any."""
        segs = split_prefixed(text, None) if text.startswith("[") else [(None, text)]
        out: list[tuple[Rule, Any]] = []
        seen: set[int] = set()
        for _rank, seg in segs:
            for _to, pid in self._scan(seg):
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
