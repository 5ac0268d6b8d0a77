"""Rule layering (rules/layers.py) and overriding a rule by id (merging.merge)."""

from __future__ import annotations

import re
from pathlib import Path

from faultwatch.rules import classify, layers

WATCHDOG = ("[rank0]:[E1206 18:44:12 ProcessGroupNCCL.cpp:607] [Rank 0] Watchdog caught "
            "collective operation timeout: WorkNCCL(SeqNum=7753) ran for 600061 milliseconds")
FLUX = "FluxError: the flux capacitor overheated at step 7"


def write(tmp_path: Path, name: str, text: str) -> Path:
    p = tmp_path / name
    p.write_text(text)
    return p


def category(rules: layers.RulesInForce, line: str) -> str | None:
    return classify(rules.ruleset, line + "\n", 1)["category"]


# ---- overriding a built-in rule by id -------------------------------------------------------

OVERRIDE_NO_KEY = """\
version: 1
rules:
  - id: nccl-watchdog-timeout
    category: fatal
    contains: "my own watchdog text"
"""


def test_override_that_drops_builtin_patterns_is_refused_with_path_line(tmp_path: Path) -> None:
    p = write(tmp_path, "site.yaml", OVERRIDE_NO_KEY)
    problems = layers.check([p])
    assert len(problems) == 1, problems
    text = str(problems[0])
    assert re.match(rf"{re.escape(str(p))}:3: ", text), text
    assert "builtin nccl.yaml:4" in text  # the rule it overrides, where
    assert "Watchdog caught collective operation timeout" in text  # what would be lost
    assert "override: merge" in text and "override: replace" in text  # the two ways out


def test_override_merge_keeps_builtin_patterns_and_changes_given_keys(tmp_path: Path) -> None:
    p = write(tmp_path, "site.yaml", OVERRIDE_NO_KEY.replace(
        "    category: fatal", "    override: merge\n    category: fatal"))
    assert layers.check([p]) == []
    rules = layers.load([p])
    rule = rules.ruleset.get("nccl-watchdog-timeout")
    assert rule is not None and rule.category == "fatal"
    assert rule.cascade is True  # not given: the built-in's
    assert "Watchdog caught collective operation timeout" in rule.regex  # kept
    assert rule.contains == ("my own watchdog text",)  # added
    assert category(rules, WATCHDOG) == "fatal"  # the built-in pattern still matches
    assert category(rules, "oops: my own watchdog text") == "fatal"
    assert rules.why("nccl-watchdog-timeout") == [
        "builtin nccl.yaml:4", f"files {p}:3 merge", "in force"]


def test_override_replace_drops_builtin_patterns_as_said(tmp_path: Path) -> None:
    p = write(tmp_path, "site.yaml", OVERRIDE_NO_KEY.replace(
        "    category: fatal", "    override: replace\n    category: fatal"))
    rules = layers.load([p])
    assert category(rules, WATCHDOG) != "fatal"
    assert category(rules, "oops: my own watchdog text") == "fatal"


def test_override_that_keeps_every_pattern_needs_no_key(tmp_path: Path) -> None:
    p = write(tmp_path, "site.yaml", """\
version: 1
rules:
  - id: nccl-watchdog-timeout
    category: fatal
    regex:
      - 'Watchdog caught collective operation timeout'
      - 'Some NCCL operations have failed or timed out'
""")
    assert layers.check([p]) == []


def test_override_of_an_unknown_id_is_refused_with_did_you_mean(tmp_path: Path) -> None:
    p = write(tmp_path, "site.yaml", """\
version: 1
rules:
  - id: nccl-watchdog-timout
    override: merge
    category: fatal
""")
    problems = [str(x) for x in layers.check([p])]
    assert any(x.startswith(f"{p}:3: ") and "did you mean 'nccl-watchdog-timeout'" in x
               for x in problems), problems


# ---- layers: built-in < files < pushed < flags ----------------------------------------------

SITE = """\
version: 1
rules:
  - id: site.flux-overheat
    category: retryable
    contains: "flux capacitor overheated"
policy:
  max_restarts: 7
  settle_s: 2
"""

UNRELATED = """\
version: 1
rules:
  - id: site.warp-breach
    category: fatal
    contains: "warp core breached"
policy:
  settle_s: 4
"""


def test_a_push_adds_a_layer_over_the_workers_files(tmp_path: Path) -> None:
    site = write(tmp_path, "site.yaml", SITE)
    pushed = layers.texts_layer("pushed", [("unrelated.yaml", UNRELATED)],
                                {"push_id": "p1", "author": "a@h"})
    base = layers.load([site], flags={"hang_window_s": 60.0})
    rules, problems = layers.build([*base.layers, pushed], base.flags)
    assert problems == [] and rules is not None
    assert category(rules, FLUX) == "retryable"  # the worker's file stays
    assert category(rules, "the warp core breached") == "fatal"  # the push adds
    assert rules.policy.max_restarts == 7 and rules.policy.settle_s == 4.0  # pushed wins
    assert rules.policy.hang_window_s == 60.0  # flags win over every layer
    origins = rules.policy_origins()
    assert origins["settle_s"] == "pushed unrelated.yaml"
    assert origins["max_restarts"] == f"files {site}" and origins["hang_window_s"] == "flags"
    d = rules.describe()
    assert [la["layer"] for la in d["layers"]] == ["builtin", "files", "pushed"]
    assert d["source"] == "pushed" and d["layers"][2]["push_id"] == "p1"
    assert d["layers"][1]["ids"] == ["site.flux-overheat"]


def test_the_pushed_layer_wins_over_the_files_on_the_same_id(tmp_path: Path) -> None:
    site = write(tmp_path, "site.yaml", SITE)
    pushed = layers.texts_layer("pushed", [("fix.yaml", SITE.replace("retryable", "fatal"))])
    rules, problems = layers.build([*layers.load([site]).layers, pushed])
    assert problems == [] and rules is not None
    assert category(rules, FLUX) == "fatal"
    assert rules.why("site.flux-overheat") == [
        f"files {site}:3", "pushed fix.yaml:3 replace", "in force"]


def test_layers_are_ordered_whatever_order_they_are_given_in(tmp_path: Path) -> None:
    site = write(tmp_path, "site.yaml", SITE)
    pushed = layers.texts_layer("pushed", [("fix.yaml", SITE.replace("retryable", "fatal"))])
    rules, _ = layers.build([pushed, layers.files_layer([site]), layers.builtin_layer()])
    assert rules is not None and category(rules, FLUX) == "fatal"


def test_one_build_for_every_caller_gives_one_version(tmp_path: Path) -> None:
    site = write(tmp_path, "site.yaml", SITE)
    from faultwatch.rollout.rules_record import build_record, ruleset_of_record
    from faultwatch.rules import load_ruleset

    assert layers.load([site]).version == load_ruleset([site]).version
    record, rs = build_record([site])
    assert ruleset_of_record(record)[0].version == rs.version == layers.load([site]).version
