"""The processor's garbage-collector settings: its job states are a large, long-lived heap.

A worker holds thousands of job states (tuples, maps, small objects), replaced a little at
every record, and nearly nothing it makes forms a reference cycle (reference counting frees
it). CPython's cyclic collector, at its defaults (a young collection every 700 container
allocations, a full one whenever a quarter of the old heap is new), walks that heap over and
over: a third of the job stage's CPU on the 1,000-job fleet (docs/bench-fleet.md). Here what
was loaded at start (modules, rules) is frozen out of the collector's sight, and the young
generation is collected every YOUNG_EVERY allocations: cycles are still collected, later.
"""

from __future__ import annotations

import gc

YOUNG_EVERY = 50_000  # container allocations (net) between young collections (CPython: 700)
MIDDLE_EVERY = 20  # young collections per middle one (CPython: 10)
OLD_EVERY = 20  # middle collections before a full one is considered (CPython: 10)


def tune() -> tuple[int, int, int]:
    """Freeze what exists now and set the thresholds above; returns the previous ones."""
    before: tuple[int, int, int] = gc.get_threshold()
    gc.collect()
    gc.freeze()
    gc.set_threshold(YOUNG_EVERY, MIDDLE_EVERY, OLD_EVERY)
    return before
