"""The tests' one waiting helper: returns what it waited for, or says what and the last value."""

from __future__ import annotations

import asyncio
import itertools

import pytest

from tests.support.waiting import wait_until, wait_until_async


def test_returns_the_first_value_that_satisfies() -> None:
    counter = itertools.count()
    assert wait_until(lambda: next(counter), 5, "three", interval_s=0,
                      until=lambda n: n >= 3) == 3


def test_timeout_names_what_and_the_last_value_seen() -> None:
    with pytest.raises(AssertionError) as err:
        wait_until(lambda: ["half"], 0.05, "the whole job", interval_s=0.01,
                   until=lambda got: len(got) > 1, detail=lambda: "log tail here")
    msg = str(err.value)
    assert "waiting for the whole job" in msg and "['half']" in msg and "log tail here" in msg


def test_a_long_text_shows_its_end() -> None:
    with pytest.raises(AssertionError) as err:
        wait_until(lambda: "x" * 5000 + "THE END", 0.01, "a needle", until=lambda t: False)
    assert "THE END" in str(err.value) and "5007 chars" in str(err.value)


def test_without_raising_the_last_value_comes_back() -> None:
    assert wait_until(lambda: [1], 0.02, interval_s=0.01, until=lambda got: len(got) > 1,
                      raise_on_timeout=False) == [1]


def test_async_probe_and_timeout() -> None:
    got: list[int] = []

    async def more() -> list[int]:
        got.append(len(got))
        return got

    async def main() -> None:
        assert await wait_until_async(more, 5, interval_s=0,
                                      until=lambda g: len(g) == 4) == [0, 1, 2, 3]
        with pytest.raises(AssertionError, match="waiting for never"):
            await wait_until_async(lambda: False, 0.02, "never")

    asyncio.run(main())
