"""An output signal's rank times are checked inline (the job stage decodes one pair per rank
and output): the same values accepted, the same errors raised as the field checks."""

from __future__ import annotations

import math
import random
from typing import Any

import pytest

from faultwatch import wire
from faultwatch.core.events import TailLine
from faultwatch.errors import DecodeError
from faultwatch.wire import _check
from faultwatch.wire.signals import _pair

ITEMS: list[Any] = [
    [0, 1.5], [7, 1_700_000_000], [None, 2.0], [wire.MAX_RANK, 0.0], [3, wire.MAX_TS],
    [-1, 1.0], [wire.MAX_RANK + 1, 1.0], [True, 1.0], [1.0, 1.0], ["1", 1.0],
    [1, True], [1, "1"], [1, -0.5], [1, wire.MAX_TS * 2], [1, math.inf], [1, math.nan],
    [1, 10**400], [1], [1, 2.0, 3], (1, 2.0), "x", None, {"r": 1},
]


def reference(item: Any) -> tuple[int | None, float]:
    """What the field checks say of one item (the path before the inline checks)."""
    p = _pair(item, "out.ranks")
    if len(p) != 2:
        raise _check._bad("out.ranks", "items must be [rank, ts]", item)
    return (_check._opt_int(p[0], "out.ranks rank", 0, wire.MAX_RANK),
            _check._num(p[1], "out.ranks ts"))


def decoded(items: list[Any]) -> Any:
    d = {"t": "out", "job": "j", "attempt": 0, "node": "n", "ts": 1.0, "count": 1,
         "ranks": items, "tail": []}
    try:
        return wire.signal_of(d).rank_last_ts
    except (DecodeError, OverflowError) as e:
        return type(e), str(e)


def expected(items: list[Any]) -> Any:
    try:
        return tuple(reference(x) for x in items)
    except (DecodeError, OverflowError) as e:
        return type(e), str(e)


@pytest.mark.parametrize("item", ITEMS, ids=repr)
def test_each_item_is_accepted_or_refused_as_by_the_field_checks(item: Any) -> None:
    assert decoded([[1, 1.0], item]) == expected([[1, 1.0], item])


def test_random_lists_decode_as_by_the_field_checks() -> None:
    rng = random.Random(14)
    good = [x for x in ITEMS if not isinstance(expected([x])[0], type)]
    assert len(good) == 6  # positive control: some items are accepted, the rest refused
    for _ in range(300):
        items = [rng.choice(good if rng.random() < 0.9 else ITEMS) for _ in range(12)]
        got = decoded(items)
        assert got == expected(items)
        if not isinstance(got[0], type):
            assert all(type(t) is float for _, t in got)


# an output's tail rows [rank, ts, text] are checked inline too
TAIL_ITEMS: list[Any] = [
    [0, 1.5, "a"], [None, 2.0, ""], [wire.MAX_RANK, wire.MAX_TS, "x" * 100],
    [3, 1_700_000_000, "int time"],  # valid, off the usual shape: the field checks take it
    [-1, 1.0, "a"], [wire.MAX_RANK + 1, 1.0, "a"], [True, 1.0, "a"], [1, True, "a"],
    [1, -0.5, "a"], [1, math.nan, "a"], [1, math.inf, "a"], [1, 1.0, 5], [1, 1.0, None],
    [1, 1.0, "x" * (_check.MAX_TEXT_CHARS + 1)], [1, 1.0], (1, 1.0, "a"), "abc", None,
]


def tail_reference(item: Any) -> tuple[Any, ...]:
    p = _pair(item, "out.tail")
    if len(p) != 3:
        raise _check._bad("out.tail", "items must be [rank, ts, text]", item)
    return (_check._opt_int(p[0], "out.tail rank", 0, wire.MAX_RANK),
            _check._num(p[1], "out.tail ts"), _check._text(p[2], "out.tail text"))


def tail_decoded(items: list[Any]) -> Any:
    d = {"t": "out", "job": "j", "attempt": 0, "node": "n", "ts": 1.0, "count": 1,
         "ranks": [], "tail": items}
    try:
        tail = wire.signal_of(d).tail
    except DecodeError as e:
        return type(e), str(e)
    assert all(type(t) is TailLine and type(t.ts) is float for t in tail)
    return tuple(tuple(t) for t in tail)


def tail_expected(items: list[Any]) -> Any:
    try:
        return tuple(tail_reference(x) for x in items)
    except DecodeError as e:
        return type(e), str(e)


@pytest.mark.parametrize("item", TAIL_ITEMS, ids=lambda x: repr(x)[:40])
def test_each_tail_row_is_accepted_or_refused_as_by_the_field_checks(item: Any) -> None:
    assert tail_decoded([[1, 1.0, "a"], item]) == tail_expected([[1, 1.0, "a"], item])


def test_random_tails_decode_as_by_the_field_checks() -> None:
    rng = random.Random(37)
    good = [x for x in TAIL_ITEMS if not isinstance(tail_expected([x])[0], type)]
    assert len(good) == 5  # positive control: some rows are accepted, the rest refused
    for _ in range(300):
        items = [rng.choice(good if rng.random() < 0.9 else TAIL_ITEMS) for _ in range(8)]
        assert tail_decoded(items) == tail_expected(items)
