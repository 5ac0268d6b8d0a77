"""faultwatch/settings.py owns every FAULTWATCH_* variable: no other module spells one, each
has one type and default, booleans have one strict grammar, the child loses exactly the
secret ones, and docs/cli.md's environment table is generated from the declarations."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from faultwatch import settings
from faultwatch.agents.agent import SECRET_ENV
from faultwatch.errors import ConfigError
from faultwatch.kafka import settings as kafka_settings
from tests.support.source import literal_hits

REPO = Path(__file__).resolve().parents[2]
OWNER = {"faultwatch/settings.py"}


def test_no_module_but_settings_spells_a_faultwatch_variable() -> None:
    assert literal_hits(r"FAULTWATCH_", OWNER) == []


def test_the_scan_finds_a_planted_variable() -> None:
    """Positive control: an env read and a help text naming a variable are both found."""
    planted = ('import os\nX = os.environ.get("FAULTWATCH_NEW_KNOB")\n'
               'H = "default $FAULTWATCH_JOB"\n')
    assert len(literal_hits(r"FAULTWATCH_", OWNER,
                            sources=iter([("faultwatch/x.py", planted)]))) == 2


def test_each_variable_is_declared_once_with_a_type() -> None:
    names = [v.name for v in settings.VARS]
    assert len(names) == len(set(names))
    assert all(n.startswith(settings.PREFIX) and n.isupper() for n in names)
    for v in settings.VARS:
        assert v.default is None or isinstance(v.default, v.type), v.name


@pytest.mark.parametrize("text,want", [("1", True), ("TRUE", True), (" yes ", True),
                                       ("on", True), ("0", False), ("False", False),
                                       ("no", False), ("off", False)])
def test_one_strict_boolean_grammar(text: str, want: bool) -> None:
    assert settings.parse_bool("X", text) is want
    assert settings.FOLLOW_DECISIONS.get({settings.FOLLOW_DECISIONS.name: text}) is want


@pytest.mark.parametrize("text", ["2", "maybe", "enabled", "tru"])
def test_a_boolean_that_is_neither_is_refused_naming_the_variable(text: str) -> None:
    for var in (v for v in settings.VARS if v.type is bool):
        with pytest.raises(ConfigError, match=var.name):
            var.get({var.name: text})
    with pytest.raises(ConfigError, match="check_hostname"):  # the Kafka file's key too
        kafka_settings.from_sources({"check_hostname": text}, env={})


def test_unset_and_empty_are_the_default_and_numbers_are_checked() -> None:
    v = settings.MAX_DECISION_AGE_S
    assert v.get({}) == v.get({v.name: "  "}) == 600.0
    assert v.get({v.name: "30"}) == 30.0
    for bad in ("0.5", "1e9", "ten"):
        with pytest.raises(ConfigError, match=v.name):
            v.get({v.name: bad})
    for bad in ("0", "-5", "nan", "inf", "abc"):
        with pytest.raises(ConfigError, match=settings.FINISHED_TTL_S.name):
            settings.FINISHED_TTL_S.get({settings.FINISHED_TTL_S.name: bad})
    with pytest.raises(ConfigError, match=settings.ATTEMPT.name):
        settings.ATTEMPT.get({settings.ATTEMPT.name: "x"})


def test_the_child_loses_the_secret_variables_and_gets_its_own() -> None:
    secret = {v.name for v in settings.VARS if v.secret}
    assert set(SECRET_ENV) == secret and secret  # the agent's list is the declarations'
    env = {**{n: "s" for n in secret}, "PATH": "/bin", settings.TRUST_FILE.name: "t"}
    child = settings.child_env(env, JOB="j", NODE_NAME="n", ATTEMPT="2")
    assert not secret & set(child)
    assert child[settings.TRUST_FILE.name] == "t" and child["PATH"] == "/bin"
    assert (child[settings.JOB.name], child[settings.NODE_NAME.name],
            child[settings.ATTEMPT.name]) == ("j", "n", "2")


def test_the_kafka_keys_are_the_declared_variables() -> None:
    assert {settings.KAFKA[k].name for k in kafka_settings.KEYS} == {
        kafka_settings.ENV_PREFIX + k.upper() for k in kafka_settings.KEYS}
    got = kafka_settings.from_sources(env={settings.KAFKA["username"].name: "u",
                                           settings.KAFKA["security_protocol"].name:
                                               "SASL_PLAINTEXT",
                                           settings.KAFKA["password"].name: "p"})
    assert (got.username, got.password) == ("u", "p")


def test_docs_cli_md_holds_the_environment_table() -> None:
    assert settings.markdown() in (REPO / "docs" / "cli.md").read_text()


def test_the_docs_name_only_declared_variables() -> None:
    """A variable the docs or deploy/ mention is one faultwatch declares (a renamed or
    removed variable leaves no stale name behind)."""
    texts = [p.read_text() for p in [*(REPO / "docs").glob("*.md"), REPO / "README.md",
                                     *(p for p in (REPO / "deploy").rglob("*") if p.is_file())]]
    named = {m for t in texts for m in re.findall(r"FAULTWATCH_[A-Z0-9_]*[A-Z0-9]", t)}
    assert named and sorted(named - set(settings.BY_NAME) - {"FAULTWATCH_KAFKA"}) == []
