"""Plain data of the rule language: rules, rule sets, policy keys and matcher output."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

from faultwatch.core import policy as _policy
from faultwatch.core.events import Match
from faultwatch.core.root import DEFAULT_ACTIONS as _CORE_DEFAULT_ACTIONS

KINDS: tuple[str, ...] = ("error", "progress", "stage")
STREAMS: tuple[str, ...] = ("stdout", "stderr", "exit")
DEFAULT_ACTIONS: Mapping[str, str] = MappingProxyType(dict(_CORE_DEFAULT_ACTIONS))
DEFAULT_PRIORITY = 50

# policy key -> type (float keys accept ints) and the strings' choices: derived from the one
# declaration of each key (core/policy.py), as are ranges and the checks (validate.py)
POLICY_KEYS: Mapping[str, type] = MappingProxyType(dict(_policy.TYPES))
POLICY_CHOICES: Mapping[str, tuple[str, ...]] = MappingProxyType(dict(_policy.CHOICES))


@dataclass(frozen=True, slots=True)
class RuleTest:
    """One inline example of a rule: a line that must (or must not) match."""

    text: str
    expect_match: bool
    line: int
    step: int | None = None
    total: int | None = None


@dataclass(frozen=True, slots=True)
class Rule:
    """One rule as loaded and validated: how to recognise a line or an exit status."""

    id: str
    kind: str = "error"
    category: str | None = None
    contains: tuple[str, ...] = ()
    regex: tuple[str, ...] = ()
    exit_codes: tuple[int, ...] = ()
    signals: tuple[int, ...] = ()
    stream: str | None = None
    action: str | None = None
    cascade: bool = False
    description: str = ""
    # where the rule's texts and verdict come from (vendor docs, source files): documentation,
    # not part of what the rule does (not in the fingerprint)
    source: tuple[str, ...] = ()
    path: str = ""
    line: int = 0
    ignore_case: bool = False
    priority: int = DEFAULT_PRIORITY
    stage: str | None = None
    opens: bool = True
    hang_window_s: float | None = None
    tests: tuple[RuleTest, ...] = ()
    # how the rule overrides an earlier rule with its id (None: it must not drop any of that
    # rule's patterns; "merge": keys given replace, patterns add; "replace": the whole rule)
    override: str | None = None
    given: frozenset[str] = frozenset()  # the keys its file gave (for override: merge)

    @property
    def effective_action(self) -> str | None:
        """The rule's action override, else its category's default."""
        if self.action is not None:
            return self.action
        return DEFAULT_ACTIONS.get(self.category or "")

    def fingerprint(self) -> dict[str, object]:
        """What the rule does (no location, no tests), for the rule set's version hash."""
        return {
            "id": self.id, "kind": self.kind, "category": self.category,
            "contains": list(self.contains), "regex": list(self.regex),
            "exit_codes": list(self.exit_codes), "signals": list(self.signals),
            "stream": self.stream, "action": self.action, "cascade": self.cascade,
            "ignore_case": self.ignore_case, "priority": self.priority, "stage": self.stage,
            "opens": self.opens, "hang_window_s": self.hang_window_s,
        }


@dataclass(frozen=True)
class RuleSet:
    """The rules in effect after merging files, the merged policy and a content version."""

    rules: tuple[Rule, ...]
    policy: Mapping[str, object] = field(default_factory=dict)
    version: str = ""
    sources: tuple[str, ...] = ()
    # exception class name -> category: the default for a traceback's final exception
    exceptions: Mapping[str, str] = field(default_factory=dict)
    # rule id -> where it was defined, earliest first ("builtin nccl.yaml:40",
    # "files site.yaml:3 merge"): why the rule in force is what it is (rules/layers.py)
    origins: Mapping[str, tuple[str, ...]] = field(default_factory=dict)

    def get(self, rule_id: str) -> Rule | None:
        """The rule with that id, or None."""
        for r in self.rules:
            if r.id == rule_id:
                return r
        return None


@dataclass(frozen=True, slots=True)
class ProgressMark:
    """A training step seen on a rank's output."""

    rank: int | None
    ts: float
    step: int
    total: int | None = None
    rule: str = ""


@dataclass(frozen=True, slots=True)
class StageMark:
    """A rank entered or left a stage (checkpoint, eval) with its own hang window."""

    rank: int | None
    ts: float
    stage: str
    opens: bool
    hang_window_s: float | None = None
    rule: str = ""
    step: int | None = None  # the step the line names (a checkpoint's), its `step` group


@dataclass(frozen=True, slots=True)
class LossMark:
    """A training-loss value a rank printed (rules/loss.py); NaN and +/-inf included."""

    rank: int | None
    ts: float
    value: float
    key: str = "loss"


@dataclass(frozen=True, slots=True)
class MatchBatch:
    """What the matcher found in one batch of lines."""

    matches: tuple[Match, ...] = ()
    progress: tuple[ProgressMark, ...] = ()
    stages: tuple[StageMark, ...] = ()
    rank_last_ts: dict[int | None, float] = field(default_factory=dict)
    ranks: tuple[int | None, ...] = ()
    timeouts: tuple[str, ...] = ()  # ids of rules whose regex timed out on this batch
    losses: tuple[LossMark, ...] = ()  # training-loss values printed (rules/loss.py)


@dataclass(frozen=True, slots=True)
class RankFailure:
    """One entry of torchrun's ChildFailedError summary."""

    rank: int | None
    local_rank: int | None
    exit_code: int | None
    signal: int | None
    host: str | None = None
    time: str | None = None
    root_cause: bool = False
