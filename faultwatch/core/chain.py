"""The timeout chain of a job (pure): its types. Every party's timers in the order they fire,
and the links between them with what happens when one does not nest (core/chain_rules.py
builds them).

Inputs are plain data: the launch (faultwatch.launch: command line, environment), the
scheduler's context, faultwatch's effective policy with the layer each key came from, the
agent's own timers, and what the processor learned from earlier runs (core/learned.py).
docs/timeouts.md describes the chain, the parties' defaults and the nesting rules.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from faultwatch.core.learned import Learned
from faultwatch.core.policy import Policy
from faultwatch.launch.model import DEFAULT, FLAG, RULES, Launch, Setting
from faultwatch.launch.scheduler import Scheduler

OK, BROKEN, UNKNOWN, NOTE = "ok", "broken", "unknown", "note"
STATUSES = (OK, BROKEN, UNKNOWN, NOTE)
PHASES = ("start", "hang", "failure", "stop")  # the order a job meets them
# the agent's own timers (faultwatch agent / run flags) and their defaults
AGENT_DEFAULTS: dict[str, float] = {
    "agent.term_grace_s": 10.0, "agent.exit_flush_timeout_s": 10.0,
    "agent.decision_wait_s": 60.0, "agent.heartbeat_s": 2.0,
    "agent.heartbeat_flowing_s": 10.0, "agent.wait_for_nodes": 0,
    "agent.wait_for_nodes_timeout_s": 900.0,
}


@dataclass(frozen=True)
class Faultwatch:
    """faultwatch's side: the effective policy, where each policy key came from
    (rules.layers.RulesInForce.policy_origins(): "flags", "files PATH", "builtin FILE"),
    the agent's timers as settings, and the version (for "default of faultwatch X")."""

    policy: Policy
    origins: Mapping[str, str] = field(default_factory=dict)
    agent: Mapping[str, Setting] = field(default_factory=dict)
    version: str = ""

    def setting(self, key: str, value: Any = None) -> Setting:
        """A policy key (or the value derived from it) as a Setting with its origin."""
        v = getattr(self.policy, key) if value is None else value
        where = self.origins.get(key)
        if where == "flags":
            return Setting(f"policy.{key}", v, FLAG, "--" + key.replace("_", "-"))
        if where:
            return Setting(f"policy.{key}", v, RULES, where)
        return Setting(f"policy.{key}", v, DEFAULT, f"faultwatch {self.version} core/policy.py")

    def agent_setting(self, key: str) -> Setting:
        s = self.agent.get(key)
        if s is not None:
            return s
        return Setting(key, AGENT_DEFAULTS[key], DEFAULT,
                       f"faultwatch {self.version} `faultwatch agent` flag")


@dataclass(frozen=True)
class Timer:
    """One row of the chain: a party's timer, its value and source, what firing means."""

    phase: str
    party: str
    name: str
    setting: Setting
    fires: str

    def to_dict(self) -> dict[str, Any]:
        return {"phase": self.phase, "party": self.party, "name": self.name,
                "value_s": self.setting.value, "source": self.setting.source(),
                "origin": self.setting.origin, "fires": self.fires}


@dataclass(frozen=True)
class Link:
    """Whether an inner timer fires before an outer one, in words.

    `status`: ok (nests), broken (does not: `consequence` says what will happen, `fix` how
    to make it nest), unknown (a value cannot be read: `says` which), note (a fact worth
    knowing that breaks no promise)."""

    id: str
    status: str
    says: str
    consequence: str = ""
    fix: str = ""

    def to_dict(self) -> dict[str, Any]:
        d = {"id": self.id, "status": self.status, "says": self.says}
        if self.consequence:
            d["consequence"] = self.consequence
        if self.fix:
            d["fix"] = self.fix
        return d


@dataclass(frozen=True)
class Inputs:
    """Everything the chain is made of (plain data)."""

    launch: Launch
    faultwatch: Faultwatch
    scheduler: Scheduler = field(default_factory=Scheduler)
    learned: Learned = field(default_factory=Learned)


@dataclass(frozen=True)
class Chain:
    timers: tuple[Timer, ...]
    links: tuple[Link, ...]
    inputs: Inputs

    @property
    def broken(self) -> tuple[Link, ...]:
        return tuple(lk for lk in self.links if lk.status == BROKEN)

    @property
    def nests(self) -> bool:
        return not self.broken

    def to_dict(self) -> dict[str, Any]:
        inp = self.inputs
        return {"nests": self.nests, "broken": len(self.broken),
                "launch": inp.launch.to_dict(), "scheduler": inp.scheduler.to_dict(),
                "learned": inp.learned.to_dict(),
                "timers": [t.to_dict() for t in self.timers],
                "links": [lk.to_dict() for lk in self.links]}


def fmt_s(x: float | None) -> str:
    """Seconds for a person: `45 s`, `10 min`, `1.5 h`; `unknown` for None."""
    if x is None:
        return "unknown"
    if x < 120 or x % 60 and x < 600:
        return f"{x:g} s"
    if x < 7200:
        return f"{x / 60:g} min" if x % 60 == 0 else f"{x / 60:.1f} min"
    return f"{x / 3600:g} h" if x % 360 == 0 else f"{x / 3600:.1f} h"
