"""The processor's garbage-collector settings: its job states are a large, long-lived heap.

A worker holds thousands of job states (tuples, maps, small objects), replaced a little at
every record, and nearly nothing it makes forms a reference cycle (reference counting frees
it). CPython's cyclic collector, at its defaults (a young collection every 700 container
allocations, a full one whenever a quarter of the old heap is new), walks that heap over and
over: a third of the job stage's CPU on the 1,000-job fleet (docs/bench-fleet.md). Here what
was loaded at start (modules, rules) is frozen out of the collector's sight, and the young
generation is collected every YOUNG_EVERY allocations: cycles are still collected, later.

Why so rarely: a young collection walks every young object still alive, and a job state
replaced a batch later is still alive at 50,000 allocations but gone at 500,000 (reference
counting freed it): on the 5,000-job fleet young collections took 12.7 of 65 CPU s at 50,000
and 2.7 at 500,000, the same peak RSS (435 MB) and the same decisions (docs/bench-fleet.md).
What waits is only cyclic garbage, at most YOUNG_EVERY objects of it.
"""

from __future__ import annotations

import gc

YOUNG_EVERY = 500_000  # container allocations (net) between young collections (CPython: 700)
MIDDLE_EVERY = 20  # young collections per middle one (CPython: 10)
OLD_EVERY = 20  # middle collections before a full one is considered (CPython: 10)


def tune() -> tuple[int, int, int]:
    """Freeze what exists now and set the thresholds above; returns the previous ones."""
    before: tuple[int, int, int] = gc.get_threshold()
    gc.collect()
    gc.freeze()
    gc.set_threshold(YOUNG_EVERY, MIDDLE_EVERY, OLD_EVERY)
    return before
