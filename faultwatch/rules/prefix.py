"""Rank attribution: strips `[rank3]:` / `[default3]:` line prefixes, splits merged lines."""

from __future__ import annotations

import re
from itertools import accumulate, compress, repeat
from operator import not_

# [rank3]:  [default3]:  [trainer3]:  (role name, then the global/local rank, then "]:")
PREFIX_RE = re.compile(r"\[([A-Za-z_]{1,32}?)(\d{1,7})\]: ?", re.ASCII)


# one or more stacked prefixes at the start of a line (the innermost rank is captured)
_LINE_PREFIXES = re.compile(r"\n(?:\[[A-Za-z_]{1,32}?(\d{1,7})\]: ?)+", re.ASCII)


def strip_fast(joined: str, n: int, default_rank: int | None
               ) -> tuple[str, list[int | None], dict[int | None, list[int]]] | None:
    """strip_joined() with the work done by C loops (one regex split, counts), not per line.

    Same result as strip_joined(); None in the same cases (a prefix in the middle of a
    line) and also when a line holds a newline.
    """
    parts = _LINE_PREFIXES.split("\n" + joined)
    pieces = parts[0::2]
    k = len(pieces) - 1
    # newlines before each prefix (inclusive running count over the text between prefixes)
    nl = list(accumulate(map(str.count, pieces, repeat("\n"))))
    if nl[-1] != n - k:
        return None
    stripped = "\n".join(pieces)[1:]
    if "[" in stripped and PREFIX_RE.search(stripped) is not None:
        return None  # merged output: a prefix in the middle of a line
    ranks: list[int | None] = [default_rank] * n
    by_rank: dict[int | None, list[int]] = {}
    prefixed = bytearray(n)
    for j, r in enumerate(map(int, parts[1::2])):
        i = nl[j] + j
        ranks[i] = r
        prefixed[i] = 1
        idx = by_rank.get(r)
        if idx is None:
            by_rank[r] = [i]
        else:
            idx.append(i)
    if k < n:
        rest = list(compress(range(n), map(not_, prefixed)))
        mine = by_rank.get(default_rank)
        by_rank[default_rank] = sorted(mine + rest) if mine else rest
    return stripped, ranks, by_rank


def strip_joined(joined: str, n: int, default_rank: int | None
                 ) -> tuple[str, list[int | None], dict[int | None, list[int]]] | None:
    """Fast path over a batch joined by newlines: (text without prefixes, ranks, line
    indices per rank).

    None when some line holds a prefix in its middle (merged output: split it line by line).
    """
    ranks: list[int | None] = [default_rank] * n
    by_rank: dict[int | None, list[int]] = {}
    pieces: list[str] = []
    line_idx = prev = cut = 0
    prev_end = -1
    for m in PREFIX_RE.finditer(joined):
        pos = m.start()
        if pos == prev_end:  # stacked prefixes: the innermost wins
            by_rank[ranks[line_idx]].pop()
            ranks[line_idx] = r = int(m.group(2))
            by_rank.setdefault(r, []).append(line_idx)
        elif pos != 0 and joined[pos - 1] != "\n":
            return None
        else:
            line_idx += joined.count("\n", prev, pos)
            prev = pos
            ranks[line_idx] = r = int(m.group(2))
            by_rank.setdefault(r, []).append(line_idx)
        pieces.append(joined[cut:pos])
        cut = prev_end = m.end()
    pieces.append(joined[cut:])
    prefixed = {i for idx in by_rank.values() for i in idx}
    if len(prefixed) < n:
        rest = sorted(set(range(n)) - prefixed)
        by_rank[default_rank] = sorted(by_rank.get(default_rank, []) + rest)
    return "".join(pieces), ranks, {r: idx for r, idx in by_rank.items() if idx}


def split_prefixed(text: str, default_rank: int | None) -> list[tuple[int | None, str]]:
    """Segments (rank, text) of one physical line; the line must start with '['.

    Consecutive prefixes (`[default0]:[rank0]:`) count as one; a prefix in the middle of a
    line (two ranks' output merged because one wrote without a newline) starts a new segment.
    """
    m = PREFIX_RE.match(text)
    if m is None:
        return [(default_rank, text)]
    out: list[tuple[int | None, str]] = []
    rank: int | None = int(m.group(2))
    start = m.end()
    while True:
        nxt = PREFIX_RE.match(text, start)
        while nxt is not None:  # stacked prefixes
            rank = int(nxt.group(2))
            start = nxt.end()
            nxt = PREFIX_RE.match(text, start)
        mid = PREFIX_RE.search(text, start)
        if mid is None:
            out.append((rank, text[start:]))
            return out
        out.append((rank, text[start:mid.start()]))
        rank = int(mid.group(2))
        start = mid.end()


def strip_rank(text: str, default_rank: int | None = None) -> tuple[int | None, str]:
    """The rank and text of a line, keeping only the first segment of a merged line."""
    if not text.startswith("["):
        return default_rank, text
    return split_prefixed(text, default_rank)[0]
