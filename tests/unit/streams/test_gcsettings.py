"""The processor's collector settings (streams/gcsettings.py): what existed is frozen, young
collections are rarer, and a reference cycle made afterwards is still collected."""

from __future__ import annotations

import gc
import weakref
from collections.abc import Iterator

import pytest

from faultwatch.streams import gcsettings


@pytest.fixture
def restored() -> Iterator[None]:
    before = gc.get_threshold()
    try:
        yield
    finally:
        gc.unfreeze()
        gc.set_threshold(*before)


class _Node:
    other: _Node | None = None


@pytest.mark.usefixtures("restored")
def test_tune_freezes_what_exists_and_still_collects_new_cycles() -> None:
    before = gc.get_threshold()
    assert gcsettings.tune() == before
    assert gc.get_threshold() == (gcsettings.YOUNG_EVERY, gcsettings.MIDDLE_EVERY,
                                  gcsettings.OLD_EVERY)
    assert gc.get_freeze_count() > 0
    a, b = _Node(), _Node()
    a.other, b.other = b, a
    gone = weakref.ref(a)
    del a, b
    assert gone() is not None  # a cycle: reference counting alone keeps it
    gc.collect()
    assert gone() is None
