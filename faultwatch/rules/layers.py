"""Rule layering: the ONE place a rule set and its policy are built, for embedded mode,
processors (at start and on every push), `rules check`, `rules push`, `rules show` and
`rules diff`.

Layers, lowest first (a higher layer wins, rule by rule and policy key by key):

    builtin   faultwatch/rules/builtin/*.yaml (dropped only by a `--no-builtin` push)
    files     the worker's own `--rules FILE` (embedded mode: the same files, re-read on change)
    pushed    the newest valid set on the rules topic (`faultwatch rules push`): it ADDS a
              layer on top of builtin + files; a later push replaces the earlier push only
    flags     the worker's policy flags (`--settle-s` ...): policy only, always win

A rule whose id an earlier file or layer already defines overrides it as its `override:` key
says (rules/merging.merge); every rule in force keeps the places that defined it
(`RuleSet.origins`), so "why is this rule what it is" has an answer.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import Any

from faultwatch.core.policy import Policy, policy_for
from faultwatch.errors import ConfigError, RuleError, RuleProblem
from faultwatch.rules.loader import FileResult, builtin_results, parse_file, parse_text
from faultwatch.rules.merging import merge
from faultwatch.rules.model import RuleSet

LAYERS: tuple[str, ...] = ("builtin", "files", "pushed")  # lowest first; then flags


@dataclass(frozen=True)
class Layer:
    """One layer: its parsed files and, for a pushed set, where it came from (push id,
    author, time, topic offset)."""

    name: str
    results: tuple[FileResult, ...]
    meta: Mapping[str, Any] = field(default_factory=dict)

    @property
    def sources(self) -> tuple[str, ...]:
        return tuple(r.path for r in self.results)


def builtin_layer() -> Layer:
    return Layer("builtin", tuple(builtin_results()))


def files_layer(paths: Sequence[str | Path]) -> Layer:
    """A worker's `--rules` files, read now."""
    return Layer("files", tuple(parse_file(p, "files") for p in paths))


def texts_layer(name: str, files: Sequence[tuple[str, str]],
                meta: Mapping[str, Any] | None = None) -> Layer:
    """A layer of (name, text) pairs, e.g. a pushed set's files."""
    return Layer(name, tuple(parse_text(n, t, name) for n, t in files),
                 MappingProxyType(dict(meta or {})))


@dataclass(frozen=True)
class RulesInForce:
    """A rule set and policy with the layers and flags they were built from."""

    ruleset: RuleSet
    policy: Policy
    layers: tuple[Layer, ...]
    flags: Mapping[str, Any] = field(default_factory=dict)

    @property
    def version(self) -> str:
        return self.ruleset.version

    def layer(self, name: str) -> Layer | None:
        return next((la for la in self.layers if la.name == name), None)

    @property
    def source(self) -> str:
        """The highest layer that contributes (what a metric label can say in one word)."""
        names = [la.name for la in self.layers if la.results]
        return names[-1] if names else "none"

    def policy_origins(self) -> dict[str, str]:
        """Policy key -> the layer and file that set it last ("flags" for a flag)."""
        out: dict[str, str] = {}
        for la in self.layers:
            for res in la.results:
                for key in res.policy:
                    out[key] = f"{la.name} {_short(res.path, la.name)}"
        for key, value in self.flags.items():
            if value is not None:
                out[key] = "flags"
        return out

    def disabled(self) -> dict[str, str]:
        """Rule id -> where it was disabled (an id defined again later is not disabled)."""
        out: dict[str, str] = {}
        for la in self.layers:
            for res in la.results:
                for rid, line in res.disabled:
                    out[rid] = f"{la.name} {_short(res.path, la.name)}:{line}"
                for rule in res.rules:
                    out.pop(rule.id, None)
        return out

    def why(self, rule_id: str) -> list[str]:
        """The definitions of a rule id, earliest first, and whether it is in force."""
        chain = list(self.ruleset.origins.get(rule_id, ()))
        if chain:
            return chain + ["in force"]
        off = self.disabled().get(rule_id)
        return [f"disabled at {off}"] if off else []

    def describe(self) -> dict[str, Any]:
        """What `rules show` prints and a worker publishes: version, layers (files, rule
        ids above the built-in layer, push id/author/time), flags, overrides, disables."""
        layers = []
        for la in self.layers:
            d: dict[str, Any] = {"layer": la.name,
                                 "files": [_short(p, la.name) for p in la.sources],
                                 "rules": sum(len(r.rules) for r in la.results)}
            if la.name != "builtin":
                d["ids"] = [r.id for res in la.results for r in res.rules]
            d.update({k: v for k, v in la.meta.items() if v is not None})
            layers.append(d)
        overridden = {rid: list(chain) for rid, chain in self.ruleset.origins.items()
                      if len(chain) > 1 or not chain[0].startswith("builtin ")}
        return {"version": self.version, "rules": len(self.ruleset.rules),
                "source": self.source, "layers": layers,
                "flags": {k: v for k, v in self.flags.items() if v is not None},
                "origins": overridden, "disabled": self.disabled(),
                "policy_origins": self.policy_origins()}


def _short(path: str, layer: str) -> str:
    return Path(path).name if layer == "builtin" else path


def build(layers: Sequence[Layer], flags: Mapping[str, Any] | None = None
          ) -> tuple[RulesInForce | None, list[RuleProblem]]:
    """The rule set and policy of these layers (sorted into LAYERS order) and flags, or
    None and every problem (`path:line: message`, the override checks included)."""
    ordered = sorted(layers, key=lambda la: LAYERS.index(la.name))
    ruleset, problems = merge([r for la in ordered for r in la.results])
    if problems:
        return None, sorted(problems, key=lambda p: (p.path, p.line))
    flags = {k: v for k, v in (flags or {}).items() if v is not None}
    try:  # the files' layer alone first, so that its errors name their file
        policy_for(ruleset.policy)
    except ConfigError as e:  # cross-key checks (e.g. floor above ceiling) of the files
        origin = RulesInForce(ruleset, Policy(), tuple(ordered)).policy_origins()
        where = origin.get(e.key, "policy").split(" ", 1)[-1]
        return None, [RuleProblem(where, 1, f"policy.{e}")]
    policy = policy_for(ruleset.policy, flags)  # a bad flag is the caller's ConfigError
    return RulesInForce(ruleset, policy, tuple(ordered), MappingProxyType(flags)), []


def load(paths: Sequence[str | Path] = (), *, builtin: bool = True,
         pushed: Layer | None = None, flags: Mapping[str, Any] | None = None) -> RulesInForce:
    """build() of the built-in layer, these files and a pushed layer; RuleError if invalid."""
    layers = [*([builtin_layer()] if builtin else []), files_layer(paths),
              *([pushed] if pushed else [])]
    rif, problems = build(layers, flags)
    if rif is None:
        raise RuleError(problems)
    return rif


def check(paths: Sequence[str | Path], *, builtin: bool = True) -> list[RuleProblem]:
    """Every problem of these files over the built-in layer (`rules check`)."""
    return build([*([builtin_layer()] if builtin else []), files_layer(paths)])[1]


def from_ruleset(ruleset: RuleSet, flags: Mapping[str, Any] | None = None,
                 layer: str = "files") -> RulesInForce:
    """A RulesInForce of an already merged rule set (callers that built one themselves,
    e.g. benches and tests): one layer holding it (`files`, or `builtin` where a pushed
    `builtin: false` may drop it), provenance as merged."""
    res = FileResult("<startup>", rules=[dataclasses.replace(r, override=None)
                                         for r in ruleset.rules], policy=dict(ruleset.policy),
                     exceptions=dict(ruleset.exceptions), layer=layer)
    rif, problems = build([Layer(layer, (res,))], flags)
    if rif is None:
        raise RuleError(problems)
    return RulesInForce(ruleset, rif.policy, rif.layers, rif.flags)
