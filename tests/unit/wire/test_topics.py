"""The one table of topics and groups (faultwatch/wire/topics.py): the clients, the topic
creation, the ACLs and the docs all read it, and no module spells a topic or group itself."""

from __future__ import annotations

import asyncio
import importlib
from pathlib import Path
from typing import Any

import pytest

from faultwatch.kafka import acls, admin
from faultwatch.wire import topics
from tests.support.source import literal_hits

REPO = Path(__file__).resolve().parents[3]
OWNER = {"faultwatch/wire/topics.py"}


def test_every_row_has_a_client_name_and_every_name_a_row() -> None:
    names = {n for n in dir(topics.Topics) if isinstance(getattr(topics.Topics, n), property)}
    assert names == {t.suffix for t in topics.TOPICS}
    t = topics.Topics("p.")
    assert {getattr(t, n) for n in names} == {spec.name("p.") for spec in topics.TOPICS}


def test_every_codec_is_a_decoder_that_exists() -> None:
    for spec in topics.TOPICS:
        module, _, func = spec.codec.partition(":")
        assert callable(getattr(importlib.import_module(module), func)), spec.codec


def test_the_acls_grant_exactly_the_tables_topics_and_groups() -> None:
    scope = acls.Scope(prefix="p.")
    literal = {(a.resource_type, a.name) for a in acls.table(scope) if a.pattern == "literal"}
    assert {n for k, n in literal if k == "topic"} == {s.name("p.") for s in topics.TOPICS}
    assert {n for k, n in literal if k == "group"} == {topics.processor_group("p."),
                                                        topics.NOTIFY_GROUP}
    prefixed = {a.name for a in acls.table(scope) if a.resource_type == "group"
                and a.pattern == "prefixed" and a.principal == acls.principals()["actuator"]}
    assert prefixed == {"p.actuate-"}
    assert topics.actuate_group("p.", "slurm").startswith(prefixed.pop())
    # each grant of a row becomes ACLs of its role on that topic, with its reason
    for spec in topics.TOPICS:
        for grant in spec.grants:
            p = acls.principals()[grant.role]
            got = {a.operation for a in acls.table(scope) if a.principal == p
                   and a.name == spec.name("p.") and a.why == grant.why}
            assert got == set(grant.ops), (spec.suffix, grant)


class _Admin:
    """The admin client's two calls ensure_topics makes, recorded."""

    def __init__(self, existing: set[str]) -> None:
        self.existing, self.created = existing, []  # type: tuple[set[str], list[Any]]

    async def start(self) -> None: ...
    async def close(self) -> None: ...

    async def list_topics(self) -> list[str]:
        return sorted(self.existing)

    async def create_topics(self, new: list[Any]) -> None:
        self.created += new


@pytest.mark.parametrize("existing", [set(), {"p.logs", "p.rules"}])
def test_topic_creation_follows_the_table(monkeypatch: pytest.MonkeyPatch,
                                          existing: set[str]) -> None:
    fake = _Admin(existing)
    monkeypatch.setattr(admin.clients, "admin", lambda **_kw: fake)
    asyncio.run(admin.ensure_all("b:1", topics.Topics("p."), partitions=3))
    made = {t.name: t for t in fake.created}
    assert set(made) == {s.name("p.") for s in topics.TOPICS} - existing
    for spec in topics.TOPICS:
        if spec.name("p.") in made:
            t = made[spec.name("p.")]
            assert t.num_partitions == (spec.partitions or 3)
            want = dict(spec.config)
            if spec.retention:
                want["retention.ms"] = str(int(topics.INCIDENTS_RETENTION_S * 1000))
            assert dict(t.topic_configs or {}) == want


def test_docs_operating_md_holds_the_topic_table() -> None:
    assert topics.markdown() in (REPO / "docs" / "operating.md").read_text()


def test_no_module_spells_the_prefix_a_topic_or_a_group() -> None:
    """The default prefix, the topic and group names are spelled in wire/topics.py alone: a
    literal `"faultwatch."`, `"faultwatch.logs"`, `"faultwatch-notify"` or an f-string
    `f"{prefix}logs"` / `f"{prefix}processor"` elsewhere is a second owner."""
    names = "|".join([s.suffix for s in topics.TOPICS] + ["processor", "actuate-"])
    hits = literal_hits(rf"^faultwatch\.({names})?$|^faultwatch-notify$", OWNER,
                        unrelated=frozenset({"client_id", "USER_AGENT"}))
    hits += literal_hits(rf"^({names})$", OWNER, after_prefix=True)
    assert hits == []


def test_the_scan_finds_a_planted_second_owner() -> None:
    """Positive control of the scan above, on planted sources."""
    planted = 'G = f"{prefix}processor"\nP = "faultwatch."\nT = f"{p}logs"\n'
    hits = literal_hits(r"^faultwatch\.$", OWNER, sources=iter([("faultwatch/x.py", planted)]))
    hits += literal_hits(r"^(logs|processor)$", OWNER, after_prefix=True,
                         sources=iter([("faultwatch/x.py", planted)]))
    assert len(hits) == 3
