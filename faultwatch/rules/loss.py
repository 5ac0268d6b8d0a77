"""Training loss values read from the frameworks' own log lines (divergence evidence).

What the frameworks print (read from their sources):
- Hugging Face Trainer, `ProgressCallback.on_log` / `PrinterCallback.on_log`
  (transformers/trainer_callback.py): `str(logs)` of the logs dict, floats formatted with
  `f"{v:.4g}"` in recent versions (`{'loss': '2.346', 'grad_norm': '1.25', ...}`, a NaN as
  `'nan'`), raw floats in older ones (`{'loss': 2.3456, ...}`, `{'loss': nan, ...}`); the
  value is `tr_loss / steps since the last log` (trainer.py), so one NaN step shows.
- Lightning's progress bar (lightning/pytorch/callbacks/progress/tqdm_progress.py
  `Tqdm.format_num`): tqdm's `.3g` then padded with zeros to 5 characters, so `loss=2.310`,
  `train_loss=nan.0`, `train_loss=inf.0`, `train_loss_step=...`.
  With its default `logging_nan_inf_filter=True` a window of NaN steps logs `'loss': '0'`
  beside `'grad_norm': 'nan'`: read as NaN (see _HF_NONFINITE_GRAD).
- Plain loops and Megatron-style lines: `loss=1.23`, `loss: 1.23`, `lm loss: 2.345E+00 |`.

Only the training series counts: `loss`, `train_loss`, `train/loss`, `lm loss`, `total loss`,
`training loss` (and `_step` forms). `eval_loss`, `val_loss`, `loss scale`, `loss_scale`,
`lm loss PPL` are other series or not losses at all and never match.

How it fits the batch matcher (measured: bench/README.md, "loss scan"): per batch, one
linear-time scan (hyperscan, else re2) of the joined lines for a NON-FINITE loss only (rare:
no hit on a healthy batch, so no Python per line), plus a sample of the finite series: each
rank's last loss line among the batch's last TAIL_LINES lines (a C substring test per line
of that tail, a parse per rank). A loss line per line (Megatron, bars with train_loss) thus
costs one parse per rank and batch, not one per line. With hyperscan the same scan reports
once whether any line holds a loss candidate (what every parse needs, see parse_loss): a
batch without one (step lines printing `loss 2.31`, no `:` or `=`) parses no line at all,
where the tail loop would have tried each of its lines. The spike detector sees one value per
rank and batch: a spike that lasts one logged step in the middle of a batch can be missed;
a NaN/inf is never missed.
"""

from __future__ import annotations

import math
import re
from bisect import bisect_left
from collections.abc import Iterable, Sequence
from itertools import accumulate, repeat
from operator import add
from typing import Any

from faultwatch.core.events import Line, line_times
from faultwatch.rules.model import LossMark
from faultwatch.rules.patterns import Pattern, build_scanner

# the scan: a loss (any case) whose value is NaN/inf, and the Trainer's NaN-filtered window
# (`'loss': '0'` right before a non-finite grad_norm); a superset of what parse_loss accepts
# (it decides). Linear-time engines only: no lookarounds here.
SCAN_PATTERNS = (
    r"loss(?:_step)?['\x22]?\s?[:=]\s?['\x22]?[-+]?(?:nan|inf)",
    r"['\x22]loss['\x22]:\s?['\x22]?0(?:\.0*)?['\x22]?,\s?['\x22]grad_norm['\x22]:\s?['\x22]?[-+]?(?:nan|inf)",
)
TAIL_LINES = 64  # lines at a batch's end searched for each rank's last (finite) loss
_NUM = r"[-+]?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?"
_NONFINITE = r"[-+]?(?:nan|inf(?:inity)?)(?:\.0*)?"
# the exact parse of a hit line (the `re` module, bounded: it runs on one line)
_PARSE = re.compile(
    r"(?<![\w/.\-])(?P<key>(?:(?:lm|total|training|train)[ _/])?loss(?:_step)?)"
    r"['\x22]?\s?[:=]\s?['\x22]?(?P<val>" + _NONFINITE + "|" + _NUM + r")(?![\w.])",
    re.IGNORECASE)
# transformers Trainer with its default logging_nan_inf_filter=True does not log a NaN/inf
# step loss: it adds the window's running average instead (trainer.py), so a window whose
# every step was NaN/inf logs exactly 0 -- next to a non-finite grad_norm. That pair is read
# as the NaN it stands for (an fp16 overflow step has an inf grad_norm but a finite loss).
_HF_NONFINITE_GRAD = re.compile(r"['\x22]grad_norm['\x22]:\s?['\x22]?[-+]?(?:nan|inf)\b",
                                re.IGNORECASE)
# what every _PARSE match holds, on a lowercased ASCII line: a line without it is no loss line
# (a literal start: found by a skip, ~20x faster than _PARSE failing on a line that prints
# `loss 2.31` with neither `:` nor `=`, as step lines often do, where the tail is all parses)
_CANDIDATE = re.compile(r"loss(?:_step)?['\x22]?\s?[:=]")
# ... as the scan sees it: any case (ASCII, as lower() on an ASCII line), `\s` spelled out as
# the ASCII characters that str's `\s` takes; reported once per batch at most (hyperscan)
CANDIDATE_SCAN = r"loss(?:_step)?['\x22]?[\t-\r\x1c-\x20]?[:=]"
HF_FILTERED_KEY = "loss(hf-nan-filtered)"
MAX_PARSE_CHARS = 4096  # of a hit line parsed (a loss is printed near the start anyway)

__all__ = ["LossMark", "LossScanner", "parse_loss"]


def parse_loss(text: str) -> tuple[str, float] | None:
    """(key, value) of the first training-loss value on a line, else None."""
    head = text[:MAX_PARSE_CHARS]
    if head.isascii() and _CANDIDATE.search(head.lower()) is None:
        return None  # (non-ASCII: IGNORECASE folds more than lower(), e.g. U+017F to s)
    m = _PARSE.search(head)
    if m is None:
        return None
    raw = m.group("val").lower()
    if "nan" in raw or "inf" in raw:  # Lightning pads them: "nan.0"
        raw = raw.split(".", 1)[0]
    try:
        value = float(raw)
    except ValueError:
        return None
    key = m.group("key").lower().replace("/", "_").replace(" ", "_")
    if value == 0.0 and key == "loss" and _HF_NONFINITE_GRAD.search(head):
        return HF_FILTERED_KEY, math.nan
    return key, value


class LossScanner:
    """Finds a batch's loss values: every rank's first non-finite one, and each rank's last
    one in the batch's tail; in line order."""

    def __init__(self, engine: str = "auto") -> None:
        pats = [Pattern(p, i, True) for i, p in enumerate(SCAN_PATTERNS)]
        # with hyperscan the same scan says whether the batch holds a loss candidate at all
        # (one report, for a batch with losses): without one, and on ASCII lines, no tail
        # line parses (a batch of step lines that print `loss 2.31`), so none is parsed
        self._cand_id: int | None = len(pats)
        scan, _pre, self.engine = build_scanner(
            [*pats, Pattern(CANDIDATE_SCAN, len(pats), True, single=True)], engine)
        if self.engine != "hyperscan":  # (re2 would report every candidate line)
            self._cand_id = None
            scan, _pre, self.engine = build_scanner(pats, self.engine)
        self._scan: Any = scan  # str for re2, bytes for hyperscan
        self._bytes = self.engine == "hyperscan"

    def scan(self, lines: Sequence[Line], ranks: Sequence[int | None],
             default_rank: int | None = None, *, texts: list[str] | None = None,
             joined: str | None = None, data: bytes | None = None
             ) -> tuple[LossMark, ...]:
        """The loss marks of a batch; `ranks` is each line's rank (the matcher's reading of
        its prefixes), shorter or empty means `default_rank`. `texts` and `joined` (the
        lines' texts and "\\n".join of them, `data` its UTF-8) are the matcher's, when it has
        them."""
        if texts is None:
            texts = getattr(lines, "texts", None) or [ln.text for ln in lines]
        n = len(texts)
        if n == 0:
            return ()
        nr = len(ranks)
        times = line_times(lines)  # (a decoded record's rows: no Line built for a time)
        found: dict[int, LossMark] = {}  # line index -> mark
        bad_ranks: set[int | None] = set()
        nonfinite, candidates = self._scan_batch(texts, joined, data)
        for i in nonfinite:
            rank = ranks[i] if i < nr else default_rank
            if rank in bad_ranks:
                continue
            parsed = parse_loss(texts[i])
            if parsed is not None and not math.isfinite(parsed[1]):
                bad_ranks.add(rank)
                found[i] = LossMark(rank, times[i], parsed[1], parsed[0])
        if not candidates:
            return tuple(found[i] for i in sorted(found))
        want = set(ranks) if nr == n else set(ranks) | {default_rank}
        done: set[int | None] = set()
        for i in range(n - 1, max(-1, n - 1 - TAIL_LINES), -1):
            t = texts[i]
            if "oss" not in t and "OSS" not in t:
                continue
            rank = ranks[i] if i < nr else default_rank
            if rank in done:
                continue
            parsed = parse_loss(t)
            if parsed is None:
                continue
            done.add(rank)
            if i not in found:
                found[i] = LossMark(rank, times[i], parsed[1], parsed[0])
            if done >= want:
                break
        return tuple(found[i] for i in sorted(found))

    def _scan_batch(self, texts: list[str], joined: str | None,
                    raw: bytes | None) -> tuple[list[int], bool]:
        """(indices of the lines a non-finite loss scan hit (none on a healthy batch), whether
        a line may hold a loss: False only when the scan saw no candidate on ASCII lines)."""
        if joined is None:
            joined = "\n".join(texts)
        data: str | bytes = joined
        if self._bytes:
            data = raw if raw is not None else joined.encode("utf-8", "replace")
        hits = self._scan(data)
        cand = self._cand_id
        if cand is not None:
            n_hits = len(hits)
            hits = [h for h in hits if h[1] != cand]  # (one at most)
            if n_hits == len(hits) and joined.isascii():
                return (self._lines_of(hits, texts, joined, data) if hits else []), False
        return (self._lines_of(hits, texts, joined, data) if hits else []), True

    @staticmethod
    def _lines_of(hits: list[tuple[int, int]], texts: list[str], joined: str,
                  data: str | bytes) -> list[int]:
        """The indices of the lines where `hits` end, once each, ascending."""
        sizes: Iterable[int] = map(len, texts)
        if isinstance(data, bytes) and len(data) != len(joined):
            sizes = (len(t.encode("utf-8", "replace")) for t in texts)
        ends = list(accumulate(map(add, sizes, repeat(1)), initial=-1))[1:]
        return sorted({bisect_left(ends, to) for to, _pid in hits} - {len(texts)})
