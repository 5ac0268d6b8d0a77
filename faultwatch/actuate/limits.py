"""How much of the fleet `actuate` may take out, pure (time passed in).

Many quarantines at once usually share a cause (network, broker, storage, a bad rule): the
anchor is Kubernetes' node lifecycle controller, which evicts at `--node-eviction-rate` and
stops when a zone's unhealthy share passes `--unhealthy-zone-threshold`. Here a drain (or
taint) is allowed while both hold:

- at most `max_drains_per_window` drains in the last `window_s` seconds, and
- at most `max_drained_share` of the nodes actuate knows (the registry) drained by faultwatch
  at once, but always `min_drained_nodes` (a small fleet, or one whose registry lists few
  nodes, can still lose its few bad nodes).

Beyond that the drain is held, with every later one, until an operator releases the hold
(`faultwatch actuate --release-hold`): the held drains then run, and counting starts afresh.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass


@dataclass(frozen=True)
class ActuateLimits:
    max_drains_per_window: int = 5
    window_s: float = 600.0
    max_drained_share: float = 0.1
    min_drained_nodes: int = 3

    def __post_init__(self) -> None:
        if self.max_drains_per_window < 1:
            raise ValueError("max_drains_per_window must be >= 1")
        if not self.window_s > 0:
            raise ValueError("window_s must be > 0")
        if not 0 < self.max_drained_share <= 1:
            raise ValueError("max_drained_share must be in (0, 1]")

    def max_drained(self, known_nodes: int) -> int:
        return max(self.min_drained_nodes, math.floor(self.max_drained_share * known_nodes))


class DrainLimiter:
    """`allow(node, known, now)`: may `node` be drained now? `drained(node, now)` after a
    drain, `resumed(node)` after a release; `reset(now)` when an operator releases a hold."""

    def __init__(self, limits: ActuateLimits) -> None:
        self.limits = limits
        self.recent: deque[float] = deque()  # times of drains inside the window
        self.nodes: set[str] = set()  # drained by faultwatch, not resumed

    def why_not(self, node: str, known: int, now: float) -> str | None:
        """None when the drain may go, else the limit it would pass (in words)."""
        lim = self.limits
        while self.recent and self.recent[0] <= now - lim.window_s:
            self.recent.popleft()
        if node in self.nodes:
            return None  # already drained: doing it again takes nothing more
        if len(self.recent) >= lim.max_drains_per_window:
            return (f"{len(self.recent)} drains in the last {lim.window_s:.0f} s "
                    f"(limit {lim.max_drains_per_window})")
        cap = lim.max_drained(known)
        if len(self.nodes) + 1 > cap:
            return (f"{len(self.nodes)} of {known} known nodes drained (limit "
                    f"{lim.max_drained_share:.0%}, {cap} nodes)")
        return None

    def drained(self, node: str, now: float) -> None:
        if node not in self.nodes:
            self.nodes.add(node)
            self.recent.append(now)

    def resumed(self, node: str) -> None:
        self.nodes.discard(node)

    def reset(self) -> None:
        """An operator released a hold: the window starts empty (drained nodes still count
        toward the share until they are resumed)."""
        self.recent.clear()
