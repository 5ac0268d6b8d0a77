"""The policy knobs (AIMaster's parameters, pythonic names, units in names), each declared
once: its default, type, range, choices, meaning and CLI flag live on its field. The rule-file
validation (rules/validate), the CLI flags (cli/options), the checks below and docs/rules.md's
policy table are all derived from these declarations."""

from __future__ import annotations

import dataclasses
import math
import re
from collections.abc import Mapping
from dataclasses import dataclass, fields
from typing import Any

from faultwatch.errors import ConfigError

DAY_S = 86400.0
EXECUTION_MODES = ("sync", "async")
FAULT_TOLERANT_POLICIES = ("on_failure", "exit_code_and_error_msg", "never")
# what a diverged loss (NaN/inf) or a loss spike does: a notice, a restart from the last
# checkpoint (the job's own resume), or failing the job
DIVERGENCE_ACTIONS = ("notify", "restart", "fail")
# what a lemon node (core/lemons.py) gets: a notice, or also a quarantine in the registry
LEMON_ACTIONS = ("notify", "quarantine")


@dataclass(frozen=True)
class Knob:
    """What a policy key is. Numbers lie in [lo, hi] (`open` names the open ends: "lo",
    "hi" or "both"; `off` is one more value outside that means off); strings are one of
    `choices`. `flag`: the help of `run`/`process`'s --KEY flag; `switch`: the --no-X flag
    that turns a boolean off, and its help. `default_doc` is the docs' default cell where
    the value needs words. The ranges' low ends allow the short windows tests and demos
    use; the high ends stop values that switch a detector off by absurdity (a one-year
    quarantine from `blacklist_s: 1e10`, a budget of 1e9 restarts) or make it fire on
    every record (`node_lost_s: 0.01`)."""

    doc: str
    lo: float | None = None
    hi: float | None = None
    open: str = ""
    off: float | None = None
    choices: tuple[str, ...] = ()
    flag: str = ""
    switch: tuple[str, str] = ("", "")  # (--no-FLAG, its help)
    default_doc: str = ""


def knob(default: Any, doc: str, **kw: Any) -> Any:
    """A Policy field declared with its Knob."""
    return dataclasses.field(default=default, metadata={"knob": Knob(doc, **kw)})


W7 = dict(lo=1.0, hi=7 * DAY_S)  # a window of 1 s .. 7 days
D1 = dict(lo=1.0, hi=DAY_S)


@dataclass(frozen=True)
class Policy:
    """How a job's failures, hangs and exit hangs turn into decisions."""

    execution_mode: str = knob(
        "sync", "restart the whole job, or only the failed instance",
        choices=EXECUTION_MODES, flag="sync (restart the whole job) or async (restart failed "
                                      "nodes)")
    enable_restart: bool = knob(True, "restart at all", switch=(
        "--no-restart", "never restart: every failure fails the job"))
    max_restarts: int = knob(3, "restarts before the job is failed", lo=0, hi=1000,
                             flag="restarts before the job is failed")
    hang_detection: bool = knob(
        True, "every rank silent for the hang window → restart (kind `hang`)",
        switch=("--no-hang-detection", "never decide a hang"))
    # None: adaptive (learned per job and stage, see core/windows.py); a number: fixed window
    hang_window_s: float | None = knob(
        None, "a fixed silence window; unset = learned from the job's output cadence", **W7,
        default_doc="unset (adaptive)",
        flag="every rank silent this long -> hang (seconds; default: learned from the job's "
             "output, between --hang-floor-s and --hang-ceiling-s)")
    init_window_s: float | None = knob(
        None, "silence allowed before an attempt's first line; unset = max(window, 120)",
        **W7, default_doc="unset (max(window, 120))",
        flag="silence allowed before an attempt's first output line (default: max(hang "
             "window, 120 s))")
    adaptive_hang: bool = knob(
        True, "learn the window (5 × p99 gap between outputs) when `hang_window_s` is unset",
        switch=("--no-adaptive-hang", "never learn the hang window from the job"))
    hang_floor_s: float = knob(30.0, "the learned window is never shorter", **W7,
                               flag="shortest learned (adaptive) hang window (seconds)")
    hang_ceiling_s: float = knob(
        600.0, "nor longer; also the window before anything is learned, and when a silence "
               "past the learned window shows no ranks waiting for each other "
               "([hangs](hangs.md))", **W7,
        flag="longest learned hang window; used before anything is learned, and for a "
             "silence in which no rank waits for another")
    # A learned window decides only on evidence that ranks wait for each other (docs/hangs.md);
    # a silence without it is decided at hang_ceiling_s, or once every rank has sat blocked at
    # an unchanged stack, using no CPU, for stuck_stacks_s
    hang_needs_evidence: bool = knob(
        True, "a learned window decides a hang only on evidence that ranks wait for each other "
              "(stacks, Flight Recorder); without it the silence is a `hang-deferred` notice "
              "until `hang_ceiling_s` ([hangs](hangs.md))")
    stuck_stacks_s: float = knob(
        300.0, "a silence in which no rank communicates is a hang before the ceiling once "
               "every rank sat blocked at an unchanged stack, using no CPU, this long", **W7,
        flag="a silence in which no rank communicates is a hang before the ceiling once every "
             "rank sat blocked at an unchanged stack this long (seconds)")
    # before deciding a hang, ask the agents for every rank's stack and Flight Recorder dump
    # (a `diagnose` notify) when the silence reaches this fraction of the window
    diagnose: bool = knob(True, "before deciding a hang, ask the agents for the ranks' stacks "
                                "and Flight Recorder dumps (a `diagnose` notify) and name the "
                                "culprit from them")
    diagnose_at: float = knob(0.5, "when (share of the hang window of silence) the diagnosis "
                                   "is asked for", lo=0.0, hi=1.0, open="both")
    checkpoint_extend_s: float = knob(
        1800.0, "longest a hang is deferred while a rank's stack shows a checkpoint write "
                "(`hang-deferred` notify)", **W7)
    progress_stall_detection: bool = knob(True, "SDK progress stops while lines go on → hang")
    node_lost_detection: bool = knob(True, "no heartbeat from a node → `node-lost`")
    node_lost_s: float = knob(30.0, "that silence (processor time, only when caught up)", **D1,
                              flag="no heartbeat from a node this long -> node lost (seconds)")
    slow_rank_detection: bool = knob(True, "notify about a rank whose step time lags the "
                                           "job's median")
    slow_factor: float = knob(1.5, "that lag, as a factor of the median step time", lo=1.0,
                              hi=100.0, open="lo")
    skew_warn_s: float = knob(120.0, "nodes of one attempt starting this far apart → notify",
                              **D1)
    blacklist_s: float = knob(1800.0, "first blacklist of a node; doubles with each repeat",
                              lo=1.0, hi=30 * DAY_S)
    short_attempt_s: float = knob(300.0, "a failed attempt shorter than this counts against "
                                         "its nodes", **D1)
    suspect_after: int = knob(3, "short failed attempts before a node is a blacklist "
                                 "candidate", lo=1, hi=1000)
    storm_max_restarts: int = knob(5, "restarts within `storm_window_s` before the job is "
                                      "failed", lo=1, hi=1000)
    storm_window_s: float = knob(600.0, "that window", **W7)
    restart_backoff_s: float = knob(5.0, "not-before hint of a restart, doubled per recent "
                                         "restart", lo=0.0, hi=3600.0)
    exit_hang_detection: bool = knob(True, "one instance done, job not ended within the "
                                           "window → restart")
    exit_hang_window_s: float = knob(300.0, "that window", **W7,
                                     flag="one node finished, others still running this long "
                                          "(seconds)")
    fault_tolerant_policy: str = knob("exit_code_and_error_msg", "which failures restart",
                                      choices=FAULT_TOLERANT_POLICIES,
                                      flag="on_failure | exit_code_and_error_msg | never")
    max_same_error: int = knob(10, "the same error on one instance more often → fail", lo=1,
                               hi=100_000, flag="the same error on one instance more than N "
                                                "times -> fail")
    max_failure_rate: float = knob(-1.0, "failed-worker fraction above which the job fails",
                                   lo=0.0, hi=1.0, open="lo", off=-1.0, default_doc="-1 (off)",
                                   flag="fraction of failed nodes above which the job fails "
                                        "(-1 off)")
    settle_s: float = knob(3.0, "wait for other ranks' errors before deciding", lo=0.0,
                           hi=600.0, flag="wait this long after a failure for other ranks' "
                                          "errors (seconds)")
    # the blast-radius guard (core/blast.py): jobs turning lost or hung together
    fleet_storm_detection: bool = knob(True, "the blast-radius guard: many jobs lost or hung "
                                             "together hold their actions (docs/decisions.md)")
    fleet_storm_share: float = knob(0.5, "share of a worker's active jobs (or of their nodes) "
                                         "silent together that trips the guard", lo=0.0,
                                    hi=1.0, open="lo")
    fleet_storm_min_jobs: int = knob(3, "... and at least this many jobs (a lone lost job is "
                                        "decided at once)", lo=2)
    fleet_storm_window_s: float = knob(30.0, "silences starting this close together are one "
                                             "event", lo=0.0, hi=3600.0, open="lo")
    fleet_storm_hold_max_s: float = knob(600.0, "the longest a hold lasts before the fallback "
                                                "(at least `fleet_storm_window_s`)", lo=0.0,
                                         hi=DAY_S, open="lo")
    fleet_storm_release_per_min: float = knob(6.0, "the fallback: held jobs still silent are "
                                                   "decided at most this many a minute",
                                              lo=0.0, hi=6000.0, open="lo")
    retryable_errors: tuple[str, ...] = knob((), "extra substrings that mark a failure "
                                                 "retryable", default_doc="[]")
    # divergence (core/divergence.py): loss values read from the ranks' log lines
    divergence_detection: bool = knob(True, "read training losses from the ranks' lines and "
                                            "the SDK; a NaN/inf loss or a spike is a "
                                            "`divergence` (docs/decisions.md, Divergence)")
    divergence_action: str = knob("notify", "what a NaN/inf loss does (`restart`: from the "
                                            "last checkpoint)", choices=DIVERGENCE_ACTIONS)
    loss_spike_action: str = knob("notify", "what a loss spike does", choices=DIVERGENCE_ACTIONS)
    loss_spike_factor: float = knob(3.0, "a spike: a loss above this × the median of the "
                                         "recent losses", lo=1.0, hi=1e6, open="lo")
    loss_window: int = knob(50, "how many recent finite losses that median is over", lo=2,
                            hi=10_000)
    # lemon nodes (core/lemons.py): blamed in incidents of this many distinct jobs within
    # the window -> a `lemon-node` notice; `quarantine` also quarantines it in the registry
    lemon_detection: bool = knob(True, "name lemon nodes: nodes blamed in incidents of "
                                       "several distinct jobs (docs/goodput.md)")
    lemon_min_jobs: int = knob(3, "a node blamed in incidents of this many distinct jobs "
                                  "within the window is a lemon", lo=2, hi=1000)
    lemon_window_s: float = knob(7 * DAY_S, "the window those incidents fall in", lo=60.0,
                                 hi=90 * DAY_S)
    lemon_action: str = knob("notify", "a `lemon-node` notice only, or also a quarantine in "
                                       "the node registry (actuate's limits apply)",
                             choices=LEMON_ACTIONS)

    def __post_init__(self) -> None:
        for f in fields(self):
            value = getattr(self, f.name)
            why = None if value is None else value_error(f.name, value)
            if why is not None:
                raise ConfigError(f.name, why)
        if self.hang_floor_s > self.hang_ceiling_s:
            raise ConfigError("hang_floor_s", "must be <= hang_ceiling_s")
        if self.fleet_storm_hold_max_s < self.fleet_storm_window_s:
            raise ConfigError("fleet_storm_hold_max_s",
                              "must be in [fleet_storm_window_s, 86400] seconds")

    @property
    def effective_init_window_s(self) -> float:
        """Silence allowed before an attempt prints anything (imports, rendezvous, restarts)."""
        if self.init_window_s is not None:
            return self.init_window_s
        base = self.hang_window_s if self.hang_window_s is not None else self.hang_ceiling_s
        return max(base, 120.0)

    def with_overrides(self, values: Mapping[str, Any]) -> Policy:
        """A copy with the given keys replaced; unknown keys and wrong types are ConfigErrors."""
        changes: dict[str, Any] = {}
        for key, value in values.items():
            if value is None:
                continue
            if key not in KNOBS:
                raise ConfigError(key, "unknown policy key")
            changes[key] = _coerce(key, value)
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


# ---- derived from the declarations ---------------------------------------------------------

KNOBS: dict[str, Knob] = {f.name: f.metadata["knob"] for f in fields(Policy)}
DEFAULTS: dict[str, Any] = {f.name: f.default for f in fields(Policy)}


def _kind(default: Any) -> type:
    if isinstance(default, bool | int | str):
        return type(default)
    return list if isinstance(default, tuple) else float  # None: an unset window


# key -> the type a rule file gives (float keys accept ints; a tuple is a YAML list)
TYPES: dict[str, type] = {k: _kind(d) for k, d in DEFAULTS.items()}
CHOICES: dict[str, tuple[str, ...]] = {k: kn.choices for k, kn in KNOBS.items() if kn.choices}
POLICY_RANGES: dict[str, tuple[float, float]] = {
    k: (kn.lo, kn.hi) for k, kn in KNOBS.items() if kn.lo is not None and kn.hi is not None}
FLAGS: tuple[tuple[str, type, str], ...] = tuple(
    (k, str if TYPES[k] is str else TYPES[k], kn.flag) for k, kn in KNOBS.items() if kn.flag)
SWITCHES: tuple[tuple[str, str, str], ...] = tuple(
    (k, *kn.switch) for k, kn in KNOBS.items() if kn.switch[0])


def _num(x: float) -> str:
    return str(int(x)) if float(x).is_integer() else f"{x:g}"


def _bounds(kn: Knob) -> str:
    lo = "-inf" if kn.lo is None else _num(kn.lo)
    hi = "inf" if kn.hi is None else _num(kn.hi)
    left = "(" if kn.open in ("lo", "both") else "["
    right = ")" if kn.open in ("hi", "both") or kn.hi is None else "]"
    return f"{left}{lo}, {hi}{right}"


def range_error(key: str, value: float) -> str | None:
    """None when value is inside key's declared range (or the key has none), else why."""
    kn = KNOBS.get(key)
    if kn is None or (kn.lo is None and kn.hi is None) or value == kn.off:
        return None
    lo_ok = kn.lo is None or (value > kn.lo if kn.open in ("lo", "both") else value >= kn.lo)
    hi_ok = kn.hi is None or (value < kn.hi if kn.open in ("hi", "both") else value <= kn.hi)
    if lo_ok and hi_ok:
        return None
    unit = " seconds" if key.endswith("_s") else ""
    off = f", or {kn.off:g} for off" if kn.off is not None else ""
    return f"must be in {_bounds(kn)}{unit}{off}, got {value:g}"


def value_error(key: str, value: Any) -> str | None:
    """None when `value` is a valid value of policy key `key` (its type, choices, finiteness
    and range), else why not: the one check of rule files, flags and Policy itself."""
    want = TYPES[key]
    if want is bool:
        return None if isinstance(value, bool) else "must be true or false"
    if want is list:
        if isinstance(value, str) or not isinstance(value, list | tuple) \
                or not all(isinstance(v, str) and v for v in value):
            return "must be a list of non-empty strings"
        return None
    if want is str:
        choices = CHOICES.get(key, ())
        if not isinstance(value, str) or (choices and value not in choices):
            return f"must be one of {', '.join(choices)}"
        return None
    if isinstance(value, bool) or not isinstance(value, int | float) \
            or (want is int and not isinstance(value, int)):
        return "must be an integer" if want is int else "must be a number"
    if not math.isfinite(value):
        return f"must be a finite number, got {value!r}"
    return range_error(key, value)


def _coerce(key: str, value: Any) -> Any:
    """A flag's or rule file's value as the field holds it; a value of the wrong type is a
    ConfigError (Policy's own check then refuses one outside its range or choices)."""
    want = TYPES[key]
    if want is bool:
        if not isinstance(value, bool):
            raise ConfigError(key, f"expected true/false, got {value!r}")
    elif want is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise ConfigError(key, f"expected an integer, got {value!r}")
    elif want is float:
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise ConfigError(key, f"expected a number, got {value!r}")
        return float(value)
    elif want is list:
        if isinstance(value, str) or not all(isinstance(v, str) for v in value):
            raise ConfigError(key, "expected a list of strings")
        return tuple(value)
    elif not isinstance(value, str):
        raise ConfigError(key, f"expected a string, got {value!r}")
    return value


def markdown() -> str:
    """docs/rules.md's policy table, derived from the declarations (a test keeps them equal)."""
    def type_cell(key: str, kn: Knob) -> str:
        want = TYPES[key]
        if want is bool:
            return "bool"
        if want is list:
            return "list of strings"
        if want is str:
            return " \\| ".join(f"`{c}`" for c in kn.choices)
        noun = "int" if want is int else "number"
        off = f" or {kn.off:g}" if kn.off is not None else ""
        bounds = _bounds(kn)
        if key.endswith("_s"):  # seconds: whole days read as days
            bounds = re.sub(r"\d+", lambda m: f"{int(m[0]) // 86400} d" if int(m[0]) >= 86400
                            and int(m[0]) % 86400 == 0 else m[0], bounds)
        return f"{noun} in {bounds}{off}"

    def default_cell(key: str, kn: Knob) -> str:
        if kn.default_doc:
            return kn.default_doc
        d = DEFAULTS[key]
        return str(d).lower() if isinstance(d, bool) else f"{d:g}" if isinstance(d, float) \
            else str(d)

    lines = ["| key | type | meaning | default |", "| --- | --- | --- | --- |"]
    lines += [f"| `{k}` | {type_cell(k, kn)} | {kn.doc} | {default_cell(k, kn)} |"
              for k, kn in KNOBS.items()]
    return "\n".join(lines)
