"""The matcher's optional native fast path (Rust: native/src/lib.rs, `faultwatch.rules._native`).

Built by `pip install .` where cargo is found (setup.py, optional): one call per batch of
lines strips every line's prefixes and reads its rank, and each rank's last time and progress
step; the exact path's hyperscan database then scans the stripped lines once for the error
and stage rules. It declines (None) a batch it would read differently from the exact path
(Matcher._exact_batch, the reference the tests compare it with). Without the module, with
FAULTWATCH_NO_NATIVE=1, or for a rule set it cannot compile, every batch takes the exact
path (same results, several times the CPU)."""

from __future__ import annotations

import importlib
import logging
from collections.abc import Sequence
from types import ModuleType
from typing import Any

from faultwatch import settings
from faultwatch.rules.normalise import MAX_STACK, MID_RANK_PATTERN, PREFIX_KINDS
from faultwatch.rules.patterns import Pattern

log = logging.getLogger(__name__)
NO_NATIVE_ENV = settings.NO_NATIVE.name


def native_module() -> ModuleType | None:
    """faultwatch.rules._native, or None when it is not built or turned off."""
    if settings.NO_NATIVE.value():
        return None
    try:
        # (by name: the layer checks read Python sources)
        return importlib.import_module("faultwatch.rules._native")
    except ImportError:
        return None


def fast_path(pats: Sequence[Pattern], scan_pats: Sequence[Pattern], p_ids: Sequence[int],
              prefilter: set[int], engine: str) -> Any:
    """The native FastPath for a matcher's progress patterns, or None (the exact path for
    every batch): `pats` as written, `scan_pats` with loosened anchors (the progress scan's),
    `p_ids` the progress ids. Only beside hyperscan (which scans what the fast path strips,
    and whose byte-wise semantics, ASCII classes and case folding, the native progress
    patterns share), and only when no pattern needs a backtracking confirmation
    (`prefilter`: the loader refuses such patterns anyway)."""
    mod = native_module()
    if mod is None or engine != "hyperscan" or prefilter:
        return None
    progress = [(scan_pats[i].source, pats[i].source, pats[i].ignore_case) for i in p_ids]
    try:
        return mod.FastPath(list(PREFIX_KINDS), MAX_STACK, MID_RANK_PATTERN, progress)
    except ValueError as e:  # a pattern the native engine cannot compile
        log.warning("native_fast_path_off reason=%s (every batch takes the exact path)", e)
        return None
