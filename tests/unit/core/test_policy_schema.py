"""Each policy key is declared once (core/policy.py: default, type, range, choices, meaning,
flag); the rule-file validation, the CLI flags and docs/rules.md's table are derived from it."""

from __future__ import annotations

import argparse
import dataclasses
from pathlib import Path

import pytest

from faultwatch.cli import options
from faultwatch.core import policy
from faultwatch.core.policy import Policy
from faultwatch.errors import ConfigError
from faultwatch.rules import POLICY_CHOICES, POLICY_KEYS
from faultwatch.rules import validate as v
from tests.support.source import literal_hits

REPO = Path(__file__).resolve().parents[3]
# where a second declaration of the keys lived: the rule-file checks (rules/model.py's
# table is checked by equality above: it also names a stage rule's own hang_window_s),
# the CLI's flag table
SECOND_OWNERS = ("faultwatch/rules/validate.py",
                 "faultwatch/cli/options.py", "faultwatch/cli/run.py", "faultwatch/cli/process.py")


def test_every_field_is_declared_with_a_knob() -> None:
    assert [f.name for f in dataclasses.fields(Policy)] == list(policy.KNOBS)
    assert dict(POLICY_KEYS) == policy.TYPES and dict(POLICY_CHOICES) == policy.CHOICES


def test_no_second_owner_spells_a_policy_key() -> None:
    """Other modules use keys (a detector reads `policy.settle_s`); none of the places that
    once held a second table of them spells one."""
    keys = "|".join(policy.KNOBS)
    hits = [h for h in literal_hits(rf"^({keys})$", set()) if h.split(":")[0] in SECOND_OWNERS]
    assert hits == []


def test_the_scan_finds_a_planted_flag_table() -> None:
    """Positive control: a hand-written flag row in cli/options.py is found."""
    planted = 'POLICY_FLAGS = (("hang_window_s", float, "every rank silent"),)\n'
    hits = literal_hits(r"^hang_window_s$", set(),
                        sources=iter([("faultwatch/cli/options.py", planted)]))
    assert [h.split(":")[0] for h in hits] == ["faultwatch/cli/options.py"]


def _parsed(*argv: str) -> argparse.Namespace:
    p = argparse.ArgumentParser()
    options.add_policy(p)
    return p.parse_args(list(argv))


def test_the_flags_are_the_declared_ones() -> None:
    flags = {a.dest for a in _parser_actions() if a.dest in policy.KNOBS}
    assert flags == {k for k, kn in policy.KNOBS.items() if kn.flag or kn.switch[0]}
    got = options.policy_overrides(_parsed("--hang-window-s", "90", "--no-restart",
                                           "--execution-mode", "async"))
    assert got == {"hang_window_s": 90.0, "enable_restart": False, "execution_mode": "async"}
    assert Policy().with_overrides(got).hang_window_s == 90.0


def _parser_actions() -> list[argparse.Action]:
    p = argparse.ArgumentParser()
    options.add_policy(p)
    return list(p._actions)


@pytest.mark.parametrize("key", list(policy.KNOBS))
def test_rule_files_flags_and_policy_agree_on_every_key(key: str) -> None:
    """The default passes all three checks; a value just past a range end fails all three."""
    default = policy.DEFAULTS[key]
    if default is not None:
        assert v.policy_value_error(key, list(default) if isinstance(default, tuple)
                                    else default) is None
    kn = policy.KNOBS[key]
    for end, step in ((kn.lo, -1), (kn.hi, +1)):
        if end is None:
            continue
        bad = end + step * (1 if policy.TYPES[key] is int else 1e-6 * max(1.0, abs(end)))
        if bad == kn.off:
            continue
        bad = int(bad) if policy.TYPES[key] is int else float(bad)
        assert v.policy_value_error(key, bad), (key, bad)
        with pytest.raises(ConfigError, match=key):
            Policy().with_overrides({key: bad})


def test_a_choice_is_checked_the_same_way() -> None:
    assert v.policy_value_error("execution_mode", "ASYNC") is None  # rule files lower-case
    assert "one of sync, async" in (v.policy_value_error("execution_mode", "both") or "")
    with pytest.raises(ConfigError, match="one of sync, async"):
        Policy(execution_mode="both")


def test_docs_rules_md_holds_the_policy_table() -> None:
    assert policy.markdown() in (REPO / "docs" / "rules.md").read_text()
