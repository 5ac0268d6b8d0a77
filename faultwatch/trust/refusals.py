"""Records refused in this process, by (what, reason): decision, rules, node_record, logs,
actuate. The counter lives in faultwatch.metrics (the bottom floor: the decision gate in
wire/signing counts into it too); the metric `faultwatch_refused_total{what,reason}` reads it."""

from __future__ import annotations

from faultwatch.metrics import REFUSALS


def refusals_text() -> dict[str, int]:
    """REFUSALS as {"what.reason": n} (for logs and tests)."""
    return {f"{w}.{r}": n for (w, r), n in sorted(REFUSALS.items())}


__all__ = ["REFUSALS", "refusals_text"]
