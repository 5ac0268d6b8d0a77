"""Records refused in this process, by (what, reason): decision, rules, node_record, logs,
actuate. The counter lives with the decision gate (faultwatch.wire.signing, below this
package); the metric `faultwatch_refused_total{what,reason}` reads it."""

from __future__ import annotations

from faultwatch.wire.signing import REFUSALS


def refusals_text() -> dict[str, int]:
    """REFUSALS as {"what.reason": n} (for logs and tests)."""
    return {f"{w}.{r}": n for (w, r), n in sorted(REFUSALS.items())}


__all__ = ["REFUSALS", "refusals_text"]
