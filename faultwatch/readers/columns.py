"""Tables as text (pure): fitting one into a terminal's width (abbreviate long cells, drop
the least useful columns, never wrap), and plain aligned lines for a pipe or a file (every
cell in full, one row per line, no trailing padding). `faultwatch status` uses both."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

ELLIPSIS = "…"
GAP = 2  # columns are separated by two spaces (rich: box=None, padding (0, 1), no edge)


@dataclass(frozen=True)
class Column:
    """A column: its header, how readily it is dropped (0: never; higher goes first), the
    narrowest it may be abbreviated to, and where an abbreviation cuts (`middle` keeps both
    ends: job and run names differ at the end as often as at the start)."""

    name: str
    drop: int = 0
    min_width: int | None = None  # None: never abbreviated
    middle: bool = False


def abbreviate(text: str, width: int, middle: bool = False) -> str:
    """`text` in at most `width` characters, an ellipsis where it was cut."""
    if len(text) <= width:
        return text
    if width <= 1:
        return ELLIPSIS[:width]
    if middle:
        head = width // 2
        tail = width - 1 - head
        return text[:head] + ELLIPSIS + (text[-tail:] if tail else "")
    return text[:width - 1] + ELLIPSIS


def fit(columns: Sequence[Column], rows: Sequence[Sequence[str]], width: int
        ) -> tuple[list[Column], list[list[str]]]:
    """The columns and cells that fit in `width` characters: abbreviate the columns that may
    be (down to their min_width), then drop columns, the highest `drop` first, until the
    rest fits; room left over goes back to the abbreviated columns, left to right. A table
    whose never-dropped columns cannot fit at their min_width is returned as narrow as it
    gets (the caller's renderer cuts it)."""
    natural = [max([len(c.name)] + [len(r[i]) for r in rows]) for i, c in enumerate(columns)]

    def floor(i: int) -> int:
        c = columns[i]
        return natural[i] if c.min_width is None else min(natural[i], max(c.min_width,
                                                                           len(c.name)))

    keep = list(range(len(columns)))

    def total(idx: list[int], w: dict[int, int]) -> int:
        return sum(w[i] for i in idx) + GAP * max(0, len(idx) - 1)

    floors = {i: floor(i) for i in keep}
    while total(keep, floors) > width:
        droppable = [i for i in keep if columns[i].drop > 0]
        if not droppable:
            break
        keep.remove(max(droppable, key=lambda i: (columns[i].drop, i)))
    widths = dict(floors)
    spare = width - total(keep, widths)
    for i in keep:
        if spare <= 0:
            break
        grow = min(spare, natural[i] - widths[i])
        widths[i] += grow
        spare -= grow
    out_rows = [[abbreviate(r[i], widths[i], columns[i].middle) for i in keep] for r in rows]
    return [columns[i] for i in keep], out_rows


def plain_lines(header: Sequence[str], rows: Sequence[Sequence[str]]) -> list[str]:
    """The header and rows as aligned lines, GAP spaces between columns, nothing cut or
    wrapped and no trailing spaces (what `kubectl get` prints into a pipe)."""
    table = [list(header), *[list(r) for r in rows]]
    widths = [max(len(r[i]) for r in table) for i in range(len(header))]
    return [(" " * GAP).join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip()
            for r in table]
