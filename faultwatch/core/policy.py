"""The policy knobs (AIMaster's parameters, pythonic names, units in names) and their validation."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from dataclasses import dataclass, fields
from typing import Any

from faultwatch.errors import ConfigError

EXECUTION_MODES = ("sync", "async")
DAY_S = 86400.0
# The documented range of every numeric policy value (docs/rules.md, "Policy ranges"): a
# value outside is refused by `rules check`, `rules push`, at load and from flags. The low
# ends allow the short windows tests and demos use; the high ends stop values that switch a
# detector off by absurdity (a one-year quarantine from `blacklist_s: 1e10`, a budget of
# 1e9 restarts) or make it fire on every record (`node_lost_s: 0.01`).
POLICY_RANGES: dict[str, tuple[float, float]] = {
    "max_restarts": (0, 1000),
    "storm_max_restarts": (1, 1000),
    "suspect_after": (1, 1000),
    "max_same_error": (1, 100_000),
    "hang_window_s": (1.0, 7 * DAY_S),
    "init_window_s": (1.0, 7 * DAY_S),
    "hang_floor_s": (1.0, 7 * DAY_S),
    "hang_ceiling_s": (1.0, 7 * DAY_S),
    "exit_hang_window_s": (1.0, 7 * DAY_S),
    "checkpoint_extend_s": (1.0, 7 * DAY_S),
    "stuck_stacks_s": (1.0, 7 * DAY_S),
    "node_lost_s": (1.0, DAY_S),
    "skew_warn_s": (1.0, DAY_S),
    "blacklist_s": (1.0, 30 * DAY_S),
    "short_attempt_s": (1.0, DAY_S),
    "storm_window_s": (1.0, 7 * DAY_S),
    "restart_backoff_s": (0.0, 3600.0),
    "settle_s": (0.0, 600.0),
    "slow_factor": (1.0, 100.0),  # and > 1
    "diagnose_at": (0.0, 1.0),  # and strictly inside
    "loss_spike_factor": (1.0, 1e6),  # and > 1
    "loss_window": (2, 10_000),
    "lemon_min_jobs": (2, 1000),
    "lemon_window_s": (60.0, 90 * DAY_S),
}


def range_error(key: str, value: float) -> str | None:
    """None when value is inside POLICY_RANGES[key] (or the key has no range), else why."""
    bounds = POLICY_RANGES.get(key)
    if bounds is None or bounds[0] <= value <= bounds[1]:
        return None
    lo, hi = bounds
    unit = " seconds" if key.endswith("_s") else ""
    return f"must be in [{lo:g}, {hi:g}]{unit}, got {value:g}"
FAULT_TOLERANT_POLICIES = ("on_failure", "exit_code_and_error_msg", "never")
# what a diverged loss (NaN/inf) or a loss spike does: a notice, a restart from the last
# checkpoint (the job's own resume), or failing the job
DIVERGENCE_ACTIONS = ("notify", "restart", "fail")
# what a lemon node (core/lemons.py) gets: a notice, or also a quarantine in the registry
LEMON_ACTIONS = ("notify", "quarantine")


@dataclass(frozen=True)
class Policy:
    """How a job's failures, hangs and exit hangs turn into decisions."""

    execution_mode: str = "sync"
    enable_restart: bool = True
    max_restarts: int = 3
    hang_detection: bool = True
    # None: adaptive (learned per job and stage, see core/windows.py); a number: fixed window
    hang_window_s: float | None = None
    init_window_s: float | None = None  # before an attempt's first output; None: max(hang, 120)
    adaptive_hang: bool = True
    hang_floor_s: float = 30.0  # the learned window is never shorter ...
    hang_ceiling_s: float = 600.0  # ... nor longer; also the window before anything is learned
    # A learned window decides only on evidence that ranks wait for each other (docs/hangs.md);
    # a silence without it is decided at hang_ceiling_s, or once every rank has sat blocked at
    # an unchanged stack, using no CPU, for stuck_stacks_s
    hang_needs_evidence: bool = True
    stuck_stacks_s: float = 300.0
    # before deciding a hang, ask the agents for every rank's stack and Flight Recorder dump
    # (a `diagnose` notify) when the silence reaches this fraction of the window
    diagnose: bool = True
    diagnose_at: float = 0.5
    checkpoint_extend_s: float = 1800.0  # silence tolerated while a rank writes a checkpoint
    progress_stall_detection: bool = True
    node_lost_detection: bool = True
    node_lost_s: float = 30.0  # no heartbeat from a live node this long (processor time)
    slow_rank_detection: bool = True
    slow_factor: float = 1.5  # a rank's step time above this x the job's median is slow
    skew_warn_s: float = 120.0  # nodes of an attempt starting this far apart -> notify
    blacklist_s: float = 1800.0  # first blacklist of a node; doubles with each repeat
    short_attempt_s: float = 300.0  # a failed attempt shorter than this counts against nodes
    suspect_after: int = 3  # short failed attempts before a node is a blacklist candidate
    storm_max_restarts: int = 5  # restarts within storm_window_s before the job is failed
    storm_window_s: float = 600.0
    restart_backoff_s: float = 5.0  # not-before hint, doubled per recent restart
    exit_hang_detection: bool = True
    exit_hang_window_s: float = 300.0
    fault_tolerant_policy: str = "exit_code_and_error_msg"
    max_same_error: int = 10
    max_failure_rate: float = -1.0
    settle_s: float = 3.0
    # the blast-radius guard (core/blast.py): jobs turning lost or hung together
    fleet_storm_detection: bool = True
    fleet_storm_share: float = 0.5  # share of active jobs (or their nodes) that trips it
    fleet_storm_min_jobs: int = 3  # ... and at least this many jobs (a lone loss is decided)
    fleet_storm_window_s: float = 30.0  # silences starting this close together are one event
    fleet_storm_hold_max_s: float = 600.0  # the longest a hold lasts; then the fallback:
    fleet_storm_release_per_min: float = 6.0  # jobs still silent decided at most this fast
    retryable_errors: tuple[str, ...] = ()
    # divergence (core/divergence.py): loss values read from the ranks' log lines
    divergence_detection: bool = True
    divergence_action: str = "notify"  # a NaN/inf loss: notify | restart | fail
    loss_spike_action: str = "notify"  # a finite loss above loss_spike_factor x the median
    loss_spike_factor: float = 3.0  # of the running median of the recent losses
    loss_window: int = 50  # recent finite losses the median is taken over
    # lemon nodes (core/lemons.py): blamed in incidents of this many distinct jobs within
    # the window -> a `lemon-node` notice; `quarantine` also quarantines it in the registry
    lemon_detection: bool = True
    lemon_min_jobs: int = 3
    lemon_window_s: float = 7 * DAY_S
    lemon_action: str = "notify"

    def __post_init__(self) -> None:
        for f in fields(self):  # a NaN window never fires, an infinite one never ends
            value = getattr(self, f.name)
            if isinstance(value, float) and not math.isfinite(value):
                raise ConfigError(f.name, f"must be a finite number, got {value!r}")
        for name in POLICY_RANGES:
            value = getattr(self, name)
            why = None if value is None else range_error(name, value)
            if why is not None:
                raise ConfigError(name, why)
        if self.execution_mode not in EXECUTION_MODES:
            raise ConfigError("execution_mode", f"must be one of {', '.join(EXECUTION_MODES)}")
        if self.fault_tolerant_policy not in FAULT_TOLERANT_POLICIES:
            raise ConfigError("fault_tolerant_policy",
                              f"must be one of {', '.join(FAULT_TOLERANT_POLICIES)}")
        for name in ("exit_hang_window_s", "hang_floor_s", "hang_ceiling_s", "node_lost_s",
                     "blacklist_s", "short_attempt_s", "storm_window_s", "skew_warn_s"):
            if getattr(self, name) <= 0:
                raise ConfigError(name, "must be > 0 seconds")
        if self.hang_window_s is not None and self.hang_window_s <= 0:
            raise ConfigError("hang_window_s", "must be > 0 seconds")
        if not 0 < self.diagnose_at < 1:
            raise ConfigError("diagnose_at", "must be a fraction of the window in (0, 1)")
        if self.checkpoint_extend_s <= 0:
            raise ConfigError("checkpoint_extend_s", "must be > 0 seconds")
        if self.hang_floor_s > self.hang_ceiling_s:
            raise ConfigError("hang_floor_s", "must be <= hang_ceiling_s")
        if self.restart_backoff_s < 0:
            raise ConfigError("restart_backoff_s", "must be >= 0 seconds")
        if self.slow_factor <= 1:
            raise ConfigError("slow_factor", "must be > 1")
        for name in ("storm_max_restarts", "suspect_after"):
            if getattr(self, name) < 1:
                raise ConfigError(name, "must be >= 1")
        if self.init_window_s is not None and self.init_window_s <= 0:
            raise ConfigError("init_window_s", "must be > 0 seconds")
        if self.settle_s < 0:
            raise ConfigError("settle_s", "must be >= 0 seconds")
        if self.max_restarts < 0:
            raise ConfigError("max_restarts", "must be >= 0")
        if self.max_same_error < 1:
            raise ConfigError("max_same_error", "must be >= 1")
        if not 0 < self.fleet_storm_share <= 1:
            raise ConfigError("fleet_storm_share", "must be a share of the jobs in (0, 1]")
        if self.fleet_storm_min_jobs < 2:
            raise ConfigError("fleet_storm_min_jobs", "must be >= 2 (a lone loss is decided)")
        if not 0 < self.fleet_storm_window_s <= 3600:
            raise ConfigError("fleet_storm_window_s", "must be in (0, 3600] seconds")
        if not self.fleet_storm_window_s <= self.fleet_storm_hold_max_s <= 86400:
            raise ConfigError("fleet_storm_hold_max_s",
                              "must be in [fleet_storm_window_s, 86400] seconds")
        if not 0 < self.fleet_storm_release_per_min <= 6000:
            raise ConfigError("fleet_storm_release_per_min", "must be in (0, 6000] a minute")
        for name in ("divergence_action", "loss_spike_action"):
            if getattr(self, name) not in DIVERGENCE_ACTIONS:
                raise ConfigError(name, f"must be one of {', '.join(DIVERGENCE_ACTIONS)}")
        if self.lemon_action not in LEMON_ACTIONS:
            raise ConfigError("lemon_action", f"must be one of {', '.join(LEMON_ACTIONS)}")
        if self.loss_spike_factor <= 1:
            raise ConfigError("loss_spike_factor", "must be > 1")
        if self.max_failure_rate != -1 and not 0 < self.max_failure_rate <= 1:
            raise ConfigError("max_failure_rate", "must be in (0, 1], or -1 for off")

    @property
    def effective_init_window_s(self) -> float:
        """Silence allowed before an attempt prints anything (imports, rendezvous, restarts)."""
        if self.init_window_s is not None:
            return self.init_window_s
        base = self.hang_window_s if self.hang_window_s is not None else self.hang_ceiling_s
        return max(base, 120.0)

    def with_overrides(self, values: Mapping[str, Any]) -> Policy:
        """A copy with the given keys replaced; unknown keys and wrong types are ConfigErrors."""
        known = {f.name: f for f in fields(self)}
        changes: dict[str, Any] = {}
        for key, value in values.items():
            if value is None:
                continue
            if key not in known:
                raise ConfigError(key, "unknown policy key")
            current = getattr(self, key)
            changes[key] = _coerce(key, value, current)
        return dataclasses.replace(self, **changes)

    def to_dict(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        d["retryable_errors"] = list(self.retryable_errors)
        return d


def policy_for(rule_policy: Mapping[str, Any],
               overrides: Mapping[str, Any] | None = None) -> Policy:
    """The one policy layering, used by embedded mode, processors and pushed rule sets:
    the defaults, then the rule files' `policy:` sections (`RuleSet.policy`, a mapping), then
    the flags (keys whose value is None are not given)."""
    return Policy().with_overrides(dict(rule_policy)).with_overrides(dict(overrides or {}))


def _coerce(key: str, value: Any, current: Any) -> Any:
    if isinstance(current, bool):
        if not isinstance(value, bool):
            raise ConfigError(key, f"expected true/false, got {value!r}")
        return value
    if isinstance(current, int):
        if isinstance(value, bool) or not isinstance(value, int):
            raise ConfigError(key, f"expected an integer, got {value!r}")
        return value
    if isinstance(current, float) or (current is None and key.endswith("_s")):
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise ConfigError(key, f"expected a number, got {value!r}")
        return float(value)
    if isinstance(current, tuple):
        if isinstance(value, str) or not all(isinstance(v, str) for v in value):
            raise ConfigError(key, "expected a list of strings")
        return tuple(value)
    if not isinstance(value, str):
        raise ConfigError(key, f"expected a string, got {value!r}")
    return value
