"""Records refused in this process, by (what, reason): decision, rules, node_record, logs,
actuate. The counter lives in faultwatch.metrics (the bottom floor: the decision gate in
wire/signing counts into it too); the metric `faultwatch_refused_total{what,reason}` reads it.
The last refusal of each kind of record is kept too (its reason, detail and time): a
processor worker announces both on its status-topic record, where `rules show` and `status`
show them."""

from __future__ import annotations

import time
from typing import Any

from faultwatch.metrics import REFUSALS

MAX_DETAIL_CHARS = 300
REFUSED_KIND = "records-refused"  # the processors' notice to an agent (streams/refusal_notices)
LAST_REFUSED: dict[str, dict[str, Any]] = {}  # what -> {reason, detail, ts}: one per kind


def note_refusal(what: str, reason: str, detail: str, now: float | None = None) -> None:
    """Count a refused record and keep it as the last of its kind."""
    REFUSALS[(what, reason)] += 1
    LAST_REFUSED[what] = {"reason": reason, "detail": detail[:MAX_DETAIL_CHARS],
                          "ts": time.time() if now is None else now}


def is_refusal(dec: object) -> bool:
    """A records-refused notice: control traffic telling an agent why its node's records
    are refused (like a probe, never on the decisions topic)."""
    return getattr(dec, "action", None) == "notify" \
        and getattr(dec, "kind", None) == REFUSED_KIND


def refusals_text() -> dict[str, int]:
    """REFUSALS as {"what.reason": n} (for logs and tests)."""
    return {f"{w}.{r}": n for (w, r), n in sorted(REFUSALS.items())}


def refusals_summary() -> dict[str, Any]:
    """What a worker announces: {"counts": {"what.reason": n}, "last": {what: {...}}}, or {}
    when nothing was refused."""
    counts = refusals_text()
    return {"counts": counts, "last": {w: dict(d) for w, d in LAST_REFUSED.items()}} \
        if counts else {}


__all__ = ["LAST_REFUSED", "REFUSALS", "REFUSED_KIND", "is_refusal", "note_refusal",
           "refusals_summary", "refusals_text"]
