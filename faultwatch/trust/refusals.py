"""Records refused in this process, by (what, reason): decision, rules, node_record, logs,
actuate. The metric `faultwatch_refused_total{what,reason}` reads it."""

from __future__ import annotations

import collections

REFUSALS: collections.Counter[tuple[str, str]] = collections.Counter()


def refusals_text() -> dict[str, int]:
    """REFUSALS as {"what.reason": n} (for logs and tests)."""
    return {f"{w}.{r}": n for (w, r), n in sorted(REFUSALS.items())}
