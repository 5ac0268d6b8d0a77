"""Time order across partitions with the reorder bound (readers/merge.py), time passed in."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from faultwatch.readers.merge import Merger


@dataclass(frozen=True)
class R:
    ts: float
    name: str


def names(rows: list[R]) -> list[str]:
    return [r.name for r in rows]


def test_history_of_two_partitions_comes_out_in_time_order() -> None:
    m: Merger[R] = Merger(window_s=1.0)
    m.partition("a", False)
    m.partition("b", False)
    for t in (10, 11, 12, 13):  # partition a read first, all of it
        m.push("a", R(t, f"a{t}"), now=0)
    assert m.pop(now=0) == []  # b has given nothing yet: hold everything
    m.push("b", R(10.5, "b10.5"), now=0)
    assert names(m.pop(now=0)) == []  # b at 10.5: nothing is 1 s behind both yet
    m.push("b", R(12.5, "b12.5"), now=0)
    assert names(m.pop(now=0)) == ["a10", "b10.5", "a11"]  # <= 12.5 - 1
    m.partition("a", True)
    m.partition("b", True)
    assert names(m.pop(now=0, final=True)) == ["a12", "b12.5", "a13"]


def test_rows_out_of_order_within_the_window_on_one_partition_are_sorted() -> None:
    m: Merger[R] = Merger(window_s=2.0)
    m.partition("p", False)
    for t, n in ((5.0, "x5"), (4.0, "y4"), (6.5, "x6.5"), (5.5, "y5.5"), (9.0, "x9")):
        m.push("p", R(t, n), now=0)
    assert names(m.pop(now=0)) == ["y4", "x5", "y5.5", "x6.5"]  # <= 9 - 2
    assert names(m.pop(now=0, final=True)) == ["x9"]


def test_the_bound_a_row_later_than_the_window_is_printed_late() -> None:
    """The documented limit: a row stamped before rows already printed (it came more than
    window_s behind its partition's frontier) is printed when it is read, after them, and
    never lost."""
    m: Merger[R] = Merger(window_s=1.0)
    m.partition("p", False)
    m.push("p", R(10.0, "a"), now=0)
    m.push("p", R(12.0, "b"), now=0)
    printed = names(m.pop(now=0))
    assert printed == ["a"]
    m.push("p", R(9.0, "late"), now=0)  # 3 s behind the frontier, after "a" was printed
    m.push("p", R(14.0, "c"), now=0)
    printed += names(m.pop(now=0))
    assert printed == ["a", "late", "b"]  # late: after "a", though stamped before it
    assert names(m.pop(now=0, final=True)) == ["c"]


def test_following_holds_a_row_at_most_the_window_after_it_was_read() -> None:
    m: Merger[R] = Merger(window_s=2.0)
    m.partition("a", True)  # caught up: arrival time rules
    m.partition("b", True)
    m.push("a", R(100.0, "a100"), now=50.0)
    assert m.pop(now=51.0) == []  # held: read 1 s ago
    m.push("b", R(99.0, "b99"), now=51.5)  # earlier stamp, read 1.5 s later: within the window
    assert names(m.pop(now=52.0)) == ["b99", "a100"]  # a100 is due; b99 is earlier: first
    m.push("b", R(98.0, "b98"), now=60.0)  # later than the window: printed when due, late
    assert m.pop(now=61.0) == []
    assert names(m.pop(now=62.0)) == ["b98"]


def test_a_partition_at_its_end_holds_nothing_back() -> None:
    m: Merger[R] = Merger(window_s=1.0)
    m.partition("busy", False)
    m.partition("idle", True)  # nothing to read there
    m.push("busy", R(1.0, "x"), now=0)
    m.push("busy", R(5.0, "y"), now=0)
    assert names(m.pop(now=0)) == ["x"]


def test_records_of_other_jobs_advance_a_partition() -> None:
    m: Merger[R] = Merger(window_s=1.0)
    m.partition("mine", False)
    m.partition("others", False)
    m.push("mine", R(1.0, "x"), now=0)
    assert m.pop(now=0) == []  # "others" has given no row: it could still hold earlier ones
    m.advance("others", 3.0)  # another job's record sent at 3.0
    m.push("mine", R(4.0, "y"), now=0)
    assert names(m.pop(now=0)) == ["x"]


def test_memory_bound_releases_the_earliest_beyond_max_held() -> None:
    m: Merger[R] = Merger(window_s=1.0, max_held=3)
    m.partition("a", False)
    m.partition("b", False)  # never gives a row: everything would be held
    for t in range(6):
        m.push("a", R(float(t), str(t)), now=0)
    assert names(m.pop(now=0)) == ["0", "1", "2"]
    assert len(m) == 3


def test_a_partition_far_ahead_is_paused_until_the_slowest_catches_up() -> None:
    m: Merger[R] = Merger(window_s=1.0, pause_ahead_s=10.0)
    m.partition("fast", False)
    m.partition("slow", False)
    m.push("slow", R(0.0, "s0"), now=0)
    m.push("fast", R(50.0, "f50"), now=0)
    assert m.ahead_of() == {"fast"}
    m.push("slow", R(45.0, "s45"), now=0)
    assert m.ahead_of() == set()


def test_equal_timestamps_keep_read_order() -> None:
    m: Merger[R] = Merger(window_s=0.0)
    m.partition("p", True)
    for n in "abcde":  # one chunk: five lines with one time
        m.push("p", R(7.0, n), now=0)
    assert names(m.pop(now=0, final=True)) == list("abcde")


def test_bad_bounds_are_refused() -> None:
    with pytest.raises(ValueError):
        Merger(window_s=-1)
