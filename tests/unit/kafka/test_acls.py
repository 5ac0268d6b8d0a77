"""The role table (faultwatch/kafka/acls.py): who may write what, and the docs say the same."""

from __future__ import annotations

from pathlib import Path

import pytest

from faultwatch.errors import UsageError
from faultwatch.kafka import acls

REPO = Path(__file__).resolve().parents[3]
SCOPE = acls.Scope(prefix="p.")


def _writes(role: str, scope: acls.Scope = SCOPE) -> set[tuple[str, str]]:
    """(pattern, name) of every topic `role` may write, create or do anything to."""
    p = acls.principals()[role]
    return {(a.pattern, a.name) for a in acls.table(scope)
            if a.principal == p and a.resource_type == "topic"
            and a.operation in ("write", "all", "create", "alter", "delete")}


def _covers(grants: set[tuple[str, str]], topic: str) -> bool:
    return any(name == topic if pattern == "literal" else topic.startswith(name)
               for pattern, name in grants)


def test_the_agent_writes_logs_and_nothing_faultwatch_acts_on() -> None:
    writes = _writes("agent")
    assert writes == {("literal", "p.logs")}
    for topic in ("decisions", "rules", "nodes", "signals", "status", "deadletter"):
        assert not _covers(writes, "p." + topic)


def test_the_processor_may_not_write_rules_or_logs_or_make_topics_of_the_prefix() -> None:
    writes = _writes("processor")
    for topic in ("decisions", "control", "signals", "status", "nodes", "deadletter",
                  "incidents", "processor-jobs-changelog", "processor-__assignor-__leader"):
        assert _covers(writes, "p." + topic), topic
    for topic in ("rules", "logs", "made-up"):
        assert not _covers(writes, "p." + topic), topic


def test_the_actuator_writes_only_what_it_did() -> None:
    """The acted topic (what it drained, when: reports read it); nothing anyone acts on."""
    assert _writes("actuator") == {("literal", "p.acted")}


def test_only_the_processor_and_operators_write_decisions() -> None:
    writers = {role for role in acls.ROLES if _covers(_writes(role), "p.decisions")}
    assert writers == {"processor", "admin"}


def test_every_topic_and_group_is_covered() -> None:
    got = {(a.resource_type, a.name) for a in acls.table(SCOPE)}
    for topic in ("logs", "signals", "decisions", "deadletter", "rules", "nodes", "status",
                  "incidents", "acted"):
        assert ("topic", "p." + topic) in got
    assert ("group", "p.processor") in got and ("group", "faultwatch-notify") in got
    assert ("group", "p.actuate-") in got


def test_the_app_id_moves_the_faust_grants() -> None:
    scope = acls.Scope(prefix="p.", app_id="myapp")
    assert _covers(_writes("processor", scope), "myapp-jobs-changelog")
    assert not _covers(_writes("processor", scope), "p.processor-jobs-changelog")
    groups = {a.name for a in acls.table(scope) if a.resource_type == "group"}
    assert "myapp" in groups


def test_principals_are_one_per_role_and_checked() -> None:
    assert acls.principals({"agent": "User:a"})["agent"] == "User:a"
    with pytest.raises(UsageError, match="own principal"):
        acls.principals({"agent": "User:faultwatch-processor"})
    with pytest.raises(UsageError, match="unknown role"):
        acls.principals({"robot": "User:r"})
    with pytest.raises(UsageError, match="TYPE:NAME"):
        acls.principals({"agent": "faultwatch-agent"})
    with pytest.raises(UsageError):
        acls.parse_principal_flags(["agent"])
    with pytest.raises(UsageError, match="empty"):
        acls.Scope(prefix="")


def test_extra_finds_a_widened_acl_only_on_this_scope() -> None:
    wanted = acls.table(SCOPE)
    widened = acls.Acl("User:faultwatch-processor", "topic", "p.rules", "literal", "write")
    broad = acls.Acl("User:faultwatch-agent", "topic", "p", "prefixed", "write")
    elsewhere = acls.Acl("User:faultwatch-processor", "topic", "q.rules", "literal", "write")
    stranger = acls.Acl("User:someone-else", "topic", "p.rules", "literal", "write")
    found = [*wanted, widened, broad, elsewhere, stranger]
    assert acls.extra(found, wanted, SCOPE) == sorted([widened, broad])
    assert acls.extra(wanted, wanted, SCOPE) == []


def test_codes_round_trip() -> None:
    for a in acls.table(SCOPE):
        assert acls.from_codes(*a.key()) == a
    odd = acls.from_codes(7, "u", 3, "User:x", "*", 13, 3)
    assert odd.resource_type == "code7" and odd.operation == "code13"
    assert odd.key()[0] == 7


def test_docs_operating_md_holds_the_role_table() -> None:
    text = (REPO / "docs" / "operating.md").read_text()
    assert acls.markdown(acls.Scope()) in text
