"""Rank attribution: strips `[rank3]:` / `[default3]:` line prefixes, splits merged lines."""

from __future__ import annotations

import re

# [rank3]:  [default3]:  [trainer3]:  (role name, then the global/local rank, then "]:")
PREFIX_RE = re.compile(r"\[([A-Za-z_]{1,32}?)(\d{1,7})\]: ?", re.ASCII)


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
