"""State records are ordered by the version their signer writes, not by a clock allowance
(issue 35 item 7): a signed quarantine or rule set written again seconds after the record that
superseded it is refused by the processor's registry follower, `actuate`, the rules follower
and `faultwatch nodes`; a newer one is taken (positive control)."""

from __future__ import annotations

import dataclasses
import time
from pathlib import Path
from typing import Any

import orjson
import pytest

from faultwatch import wire
from faultwatch.actuate.journal import Journal
from faultwatch.actuate.runner import ActuateConfig, Actuator
from faultwatch.core.policy import Policy
from faultwatch.core.registry import Reason, RegistryPolicy, quarantine, release
from faultwatch.readers.nodes import render
from faultwatch.registry.store import Refused
from faultwatch.registry.writer import RegistryWriter
from faultwatch.rollout.rules_record import build_record
from faultwatch.rollout.rules_watch import RulesWatcher
from faultwatch.rules import Matcher
from faultwatch.streams.records import LiveRules
from faultwatch.trust.records import NODE_RECORD, RULES, RecordGate, RecordSigner, RecordVerifier
from faultwatch.trust.refusals import REFUSALS
from faultwatch.trust.versions import older
from tests.support.rules import builtin_ruleset
from tests.unit.trust.helpers import make_key, trust_of


def LOG(*a: Any, **k: Any) -> None:  # noqa: N802 - a log function
    pass


@pytest.fixture(scope="module")
def keys(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    tmp = tmp_path_factory.mktemp("keys")
    proc, proc_line = make_key(tmp, "processor", "p1")
    ops, ops_line = make_key(tmp, "operator", "ops")
    return {"proc": proc, "ops": ops, "trust": trust_of(proc_line, ops_line)}


def test_older_compares_seq_then_time() -> None:
    assert older((2, 100.0), (1, 500.0))  # a lower seq loses whatever its time
    assert not older((1, 500.0), (2, 100.0))
    assert older((0, 100.0), (0, 99.0))  # records without seq: by time, no allowance
    assert not older((3, 100.0), (3, 100.0))  # the same record read again
    assert not older(None, (0, 0.0))


def test_a_quarantine_replayed_seconds_after_its_release_is_refused(
        keys: dict[str, Any], tmp_path: Path) -> None:
    now = time.time()
    pol = RegistryPolicy()
    proc = RecordSigner(keys["proc"], NODE_RECORD)
    ops = RecordSigner(keys["ops"], NODE_RECORD)
    q = quarantine(None, "n1", now - 5, Reason(ts=now - 5, event="quarantine", decision="d1",
                                                rule="xid"), pol)
    rel = release(q, "n1", now - 3, Reason(ts=now - 3, event="release", decision="manual-1"))
    # the operator's clock 30 s behind the processor's: the seq orders them anyway
    rel = dataclasses.replace(rel, updated_ts=now - 35)
    assert (q.seq, rel.seq) == (1, 2)
    q2 = quarantine(rel, "n1", now, Reason(ts=now, event="quarantine", decision="d2",
                                           rule="xid"), pol)
    signed = {name: orjson.dumps(s.sign_record(orjson.loads(wire.encode_node(r))))
              for name, s, r in (("q", proc, q), ("rel", ops, rel), ("q2", proc, q2))}
    writer = RegistryWriter(gate=RecordGate("node_record", RecordVerifier(
        keys["trust"], NODE_RECORD), LOG))
    act = Actuator(_NoBackend(), Journal(tmp_path / "j"),
                   ActuateConfig("x:1", "p.", tmp_path / "j", "g"))
    agate = RecordGate("node_record", RecordVerifier(keys["trust"], NODE_RECORD), LOG)

    def feed(name: str, offset: int) -> None:
        writer.observe(b"n1", signed[name], where=str(offset))
        act.take_node(signed[name], now, agate, topic="p.nodes", partition=0, offset=offset)

    feed("q", 0)
    feed("rel", 1)  # the release is taken though its clock says it is older
    assert writer.registry["n1"].state == act.registry["n1"].state == "healthy"
    before = REFUSALS.copy()
    feed("q", 2)  # replayed 3 s after the release
    assert writer.registry["n1"].state == act.registry["n1"].state == "healthy"
    assert (REFUSALS - before)[("node_record", "replayed")] == 2
    feed("q2", 3)  # positive control: a newer quarantine
    assert writer.registry["n1"].state == act.registry["n1"].state == "quarantined"


class _NoBackend:
    name = "none"

    def apply(self, a: Any) -> str:
        return "ok"


def test_a_rule_set_replayed_seconds_later_is_refused(keys: dict[str, Any],
                                                      tmp_path: Path) -> None:
    ops = RecordSigner(keys["ops"], RULES)
    now = time.time()

    def push(name: str, at: float, revision: int) -> bytes:
        (tmp_path / f"{name}.yaml").write_text(
            f"version: 1\nrules:\n- id: x.{name}\n  category: retryable\n  contains: {name}\n")
        value, _ = build_record([tmp_path / f"{name}.yaml"], now=at, revision=revision)
        return orjson.dumps(ops.sign_record(orjson.loads(value)))

    first = push("first", now - 2, 1)
    second = push("second", now - 40, 2)  # its pusher's clock is behind: the revision wins
    rs = builtin_ruleset()
    live = LiveRules(Matcher(rs), Policy(), rs.version)
    w = RulesWatcher("x:1", "p.rules", live, rs, {}, LOG,
                     gate=RecordGate("rules", RecordVerifier(keys["trust"], RULES), LOG))
    assert w.apply(first, "0") and w.apply(second, "1")
    kept = live.rules_version
    before = REFUSALS.copy()
    assert not w.apply(first, "2")  # the first set written again, 2 s later
    assert live.rules_version == kept
    assert (REFUSALS - before)[("rules", "replayed")] == 1
    assert w.apply(push("third", now, 3), "3") and live.rules_version != kept


def test_faultwatch_nodes_shows_refused_records_as_refused_not_as_the_state() -> None:
    q = quarantine(None, "good", 100.0, Reason(ts=100.0, event="quarantine", decision="d1",
                                                 rule="xid"), RegistryPolicy())
    refused = {"forged": Refused(1, {"unsigned": 1}, "p.nodes[0]@7"),
               "good": Refused(2, {"bad_signature": 1, "replayed": 1}, "p.nodes[0]@9")}
    table = render({"good": q}, 200.0, False, refused)
    assert table[0].startswith("forged ") and " - " in table[0] and "quarantined" not in table[0]
    assert "refused 1 record(s) (unsigned 1; last at p.nodes[0]@7)" in table[0]
    assert "quarantined" in table[1] and "bad_signature 1, replayed 1" in table[1]
    js = [orjson.loads(line) for line in render({"good": q}, 200.0, True, refused)]
    assert js[0] == {"node": "forged", "state": None, "refused": {
        "count": 1, "reasons": {"unsigned": 1}, "last_at": "p.nodes[0]@7"}}
    assert js[1]["state"] == "quarantined" and js[1]["refused"]["count"] == 2
    assert "refused" not in orjson.loads(render({"good": q}, 200.0, True)[0])
