"""Every consumer over the same table of records: a valid one acts (the positive control), and
forged, tampered, wrong-role, unsigned, `alg: none`, HMAC, replayed, expired and other-run
records are refused with a reason and counted.

Consumers: the agent's decision follower, `actuate`, `notify`, the processor's registry
follower, its rules follower and its matcher (node signatures)."""

from __future__ import annotations

import asyncio
import time
from collections import namedtuple
from collections.abc import Callable
from pathlib import Path
from typing import Any

import orjson
import pytest

from faultwatch import wire
from faultwatch.actuate.journal import Journal
from faultwatch.actuate.plan import Action
from faultwatch.actuate.runner import ActuateConfig, Actuator
from faultwatch.agents.decisions import DecisionFollower
from faultwatch.core.events import Decision, Line, RunStart
from faultwatch.core.policy import Policy
from faultwatch.core.registry import NodeRecord
from faultwatch.notify.sender import Receiver
from faultwatch.notify.service import Notifier, NotifierConfig
from faultwatch.registry.writer import RegistryWriter
from faultwatch.rollout.rules_record import build_record
from faultwatch.rollout.rules_watch import RulesWatcher
from faultwatch.rules import Matcher
from faultwatch.streams.matcher_stage import MatcherStage
from faultwatch.streams.records import InRecord, LiveRules
from faultwatch.trust.nodesig import NodeSigner, NodeVerifier
from faultwatch.trust.records import (
    DECISION,
    NODE_RECORD,
    RULES,
    DecisionGate,
    RecordGate,
    RecordSigner,
    RecordVerifier,
)
from faultwatch.trust.refusals import REFUSALS
from faultwatch.trust.replay import ReplayGuard
from faultwatch.wire.signing import Key, Keyring, sign
from tests.support.rules import builtin_ruleset
from tests.unit.trust.helpers import make_key, trust_of

TP = namedtuple("TP", "topic partition")
Msg = namedtuple("Msg", "value partition offset key")
LOG: Callable[..., None] = lambda *a, **k: None  # noqa: E731


@pytest.fixture(scope="module")
def keys(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    tmp = tmp_path_factory.mktemp("keys")
    proc, proc_line = make_key(tmp, "processor", "p1")
    proc2, proc2_line = make_key(tmp, "processor", "p2")  # rotation: both valid
    ops, ops_line = make_key(tmp, "operator", "ops")
    n1, n1_line = make_key(tmp, "node", "n1")
    n2, n2_line = make_key(tmp, "node", "n2")
    attacker, _ = make_key(tmp, "processor", "mallory")  # not in the trust file
    trust = trust_of(proc_line, proc2_line, ops_line, n1_line, n2_line)
    return {"proc": proc, "proc2": proc2, "ops": ops, "n1": n1, "n2": n2,
            "attacker": attacker, "trust": trust}


def decision(now: float, **over: Any) -> dict[str, Any]:
    d = wire.decision_to_dict(Decision(
        id=over.pop("id", "d-1"), job="J", attempt=0, action=over.pop("action", "blacklist"),
        kind="error", ts=over.pop("ts", now), nodes=("n1",), rule="xid.79",
        run_id=over.pop("run_id", "r1"), evidence={"restart_nodes": ["n2"]}))
    return {**d, **over}


def decision_variants(k: dict[str, Any], now: float) -> dict[str, tuple[bytes, str | None]]:
    """name -> (record value, the refusal reason or None for the positive control)."""
    good = RecordSigner(k["proc"], DECISION).sign_record(decision(now))
    tampered = {**good, "targets": {"nodes": ["n2"], "ranks": []}}
    hmac_ring = Keyring((Key("k1", b"0123456789abcdef0123"),))
    return {
        "valid": (orjson.dumps(good), None),
        "valid_rotated_key": (orjson.dumps(RecordSigner(k["proc2"], DECISION).sign_record(
            decision(now, id="d-2"))), None),
        "unsigned": (orjson.dumps(decision(now, id="d-3")), "unsigned"),
        "forged_unknown_key": (orjson.dumps(RecordSigner(k["attacker"], DECISION).sign_record(
            decision(now, id="d-4"))), "unknown_key"),
        "node_key": (orjson.dumps(RecordSigner(k["n1"], DECISION).sign_record(
            decision(now, id="d-5"))), "wrong_role"),
        "operator_blacklist": (orjson.dumps(RecordSigner(k["ops"], DECISION).sign_record(
            decision(now, id="d-6"))), "wrong_role"),
        "tampered": (orjson.dumps(tampered), "bad_signature"),
        "alg_none": (orjson.dumps({**decision(now, id="d-7"), "signature": {
            "alg": "none", "key_id": k["proc"].key_id, "sig": ""}}), "malformed_signature"),
        "hmac_legacy": (orjson.dumps(sign(decision(now, id="d-8"), hmac_ring)),
                        "malformed_signature"),
        "expired_40_min": (orjson.dumps(RecordSigner(k["proc"], DECISION).sign_record(
            decision(now, id="d-9", ts=now - 2400))), "too_old"),
        "from_future": (orjson.dumps(RecordSigner(k["proc"], DECISION).sign_record(
            decision(now, id="d-10", ts=now + 3600))), "from_future"),
    }


# ---- decisions: agent follower, actuate, notify ----------------------------------------

def agent_consumer(k: dict[str, Any], tmp: Path) -> Callable[[bytes, int], bool]:
    async def make() -> DecisionFollower:
        f = DecisionFollower("x:1", "p.decisions", "J", LOG, run_id="r1",
                             replay=ReplayGuard("decision", 600.0, tmp / "seen", LOG))
        f.gate = DecisionGate(RecordVerifier(k["trust"], DECISION), LOG)
        return f

    f = asyncio.run(make())

    def take(value: bytes, offset: int) -> bool:
        f._take(Msg(value, 0, offset, wire.job_key("J")))  # noqa: SLF001
        return f.get_nowait() is not None
    return take


class NoBackend:
    name = "exec"
    templates: dict[str, Any] = {}

    def apply(self, a: Action) -> str:
        return "ok"


def actuate_consumer(k: dict[str, Any], tmp: Path) -> Callable[[bytes, int], bool]:
    cfg = ActuateConfig("x:1", "p.", tmp / "journal", "g")
    act = Actuator(NoBackend(), Journal(tmp / "journal"), cfg,
                   ReplayGuard("decision", 600.0, tmp / "journal.seen", LOG))
    gate = DecisionGate(RecordVerifier(k["trust"], DECISION), LOG)

    def take(value: bytes, offset: int) -> bool:
        before = len(act.queue)
        act.take_decision(value, time.time(), gate, topic="p.decisions", partition=0,
                          offset=offset)
        return len(act.queue) > before
    return take


def notify_consumer(k: dict[str, Any], tmp: Path) -> Callable[[bytes, int], bool]:
    cfg = NotifierConfig("x:1", "p.decisions", (Receiver("http://h/x"),),
                         max_decision_age_s=600.0, replay_state=tmp / "notify.seen")
    n = Notifier(cfg, DecisionGate(RecordVerifier(k["trust"], DECISION), LOG), LOG)

    def take(value: bytes, offset: int) -> bool:
        before = len(n._where)  # noqa: SLF001
        n.take(value, TP("p.decisions", 0), offset)
        return len(n._where) > before  # noqa: SLF001
    return take


CONSUMERS = {"agent": agent_consumer, "actuate": actuate_consumer, "notify": notify_consumer}


@pytest.mark.parametrize("consumer", sorted(CONSUMERS))
def test_decision_consumers_refuse_every_bad_record(consumer: str, keys: dict[str, Any],
                                                    tmp_path: Path) -> None:
    now = time.time()
    take = CONSUMERS[consumer](keys, tmp_path)
    variants = decision_variants(keys, now)
    for offset, (name, (value, reason)) in enumerate(variants.items()):
        before = REFUSALS.copy()
        acted = take(value, offset)
        if reason is None:
            assert acted, f"{consumer}: the positive control {name} did not act"
            continue
        assert not acted, f"{consumer} acted on {name}"
        new = REFUSALS - before
        assert any(r == reason for (_w, r) in new), f"{consumer}/{name}: counted {dict(new)}"
    # replayed: the valid record written again (a new offset) after it acted
    before = REFUSALS.copy()
    assert not take(variants["valid"][0], 100)
    assert ("decision", "replayed") in REFUSALS - before or consumer == "agent"


@pytest.mark.parametrize("consumer", sorted(CONSUMERS))
def test_replay_is_refused_after_a_restart(consumer: str, keys: dict[str, Any],
                                           tmp_path: Path) -> None:
    value = decision_variants(keys, time.time())["valid"][0]
    assert CONSUMERS[consumer](keys, tmp_path)(value, 1)
    restarted = CONSUMERS[consumer](keys, tmp_path)  # the same state files, a new process
    before = REFUSALS.copy()
    assert not restarted(value, 2)
    assert ("decision", "replayed") in REFUSALS - before


def test_agent_refuses_a_decision_of_another_run_generated_ids_too(keys: dict[str, Any],
                                                                   tmp_path: Path) -> None:
    take = agent_consumer(keys, tmp_path)
    s = RecordSigner(keys["proc"], DECISION)
    now = time.time()
    before = REFUSALS.copy()
    assert not take(orjson.dumps(s.sign_record(decision(now, id="o1", run_id="g-run1"))), 1)
    assert not take(orjson.dumps(s.sign_record(decision(now, id="o2", run_id=""))), 2)
    assert {("decision", "other_run"), ("decision", "no_run")} <= set(REFUSALS - before)
    # a run joined from several generated ids names them all in run_ids
    assert take(orjson.dumps(s.sign_record({**decision(now, id="o3", run_id="g-a"),
                                            "run_ids": ["g-a", "r1"]})), 3)


# ---- registry records: the processor's follower and actuate --------------------------------

def node_record(state: str = "quarantined") -> dict[str, Any]:
    rec = NodeRecord(node="n1", state=state, until=time.time() + 3600, strikes=1,
                     updated_ts=time.time())
    return orjson.loads(wire.encode_node(rec))  # type: ignore[no-any-return]


def node_variants(k: dict[str, Any]) -> dict[str, tuple[bytes | None, str | None]]:
    return {
        "processor": (orjson.dumps(RecordSigner(k["proc"], NODE_RECORD).sign_record(
            node_record())), None),
        "operator": (orjson.dumps(RecordSigner(k["ops"], NODE_RECORD).sign_record(
            node_record())), None),
        "unsigned": (orjson.dumps(node_record()), "unsigned"),
        "node_key": (orjson.dumps(RecordSigner(k["n1"], NODE_RECORD).sign_record(
            node_record())), "wrong_role"),
        "forged": (orjson.dumps(RecordSigner(k["attacker"], NODE_RECORD).sign_record(
            node_record())), "unknown_key"),
        "tampered": (orjson.dumps({**RecordSigner(k["proc"], NODE_RECORD).sign_record(
            node_record()), "until": 4e9}), "bad_signature"),
        "a_decision_signature": (orjson.dumps({**node_record(), "signature": RecordSigner(
            k["proc"], DECISION).sign_record(node_record())["signature"]}), "bad_signature"),
        "tombstone": (None, "unsigned"),
    }


def test_registry_followers_refuse_unsigned_and_forged_records(keys: dict[str, Any],
                                                               tmp_path: Path) -> None:
    writer = RegistryWriter(gate=RecordGate("node_record", RecordVerifier(
        keys["trust"], NODE_RECORD), LOG))
    act = Actuator(NoBackend(), Journal(tmp_path / "j"), ActuateConfig("x:1", "p.",
                                                                         tmp_path / "j", "g"))
    agate = RecordGate("node_record", RecordVerifier(keys["trust"], NODE_RECORD), LOG)
    for name, (value, reason) in node_variants(keys).items():
        writer.registry.clear()
        act.registry.clear()
        if reason is None:
            writer.registry["n1"] = NodeRecord(node="n1", state="healthy")
        before = REFUSALS.copy()
        writer.observe(b"n1", value, where=name)
        act.take_node(value, time.time(), agate, topic="p.nodes", partition=0, offset=0)
        if reason is None:
            assert writer.registry["n1"].state == "quarantined", name
            assert act.registry["n1"].state == "quarantined", name
        else:
            assert "n1" not in writer.registry and "n1" not in act.registry, name
            assert (REFUSALS - before)[("node_record", reason)] == 2, name


# ---- rule sets -----------------------------------------------------------------------------

def test_rules_follower_takes_only_operator_signed_rule_sets(keys: dict[str, Any],
                                                             tmp_path: Path) -> None:
    (tmp_path / "r.yaml").write_text(
        "version: 1\nrules:\n- id: x.step\n  category: hardware\n  contains: step\n"
        "  tests:\n    match: ['step 1']\n")
    value, _rs = build_record([tmp_path / "r.yaml"], builtin=False)
    rs = builtin_ruleset()
    live = LiveRules(Matcher(rs), Policy(), rs.version)
    w = RulesWatcher("x:1", "p.rules", live, rs, {}, LOG,
                     gate=RecordGate("rules", RecordVerifier(keys["trust"], RULES), LOG))
    d = orjson.loads(value)
    variants: dict[str, tuple[bytes | None, str | None]] = {
        "unsigned": (value, "unsigned"),
        "processor_key": (orjson.dumps(RecordSigner(keys["proc"], RULES).sign_record(d)),
                          "wrong_role"),
        "forged": (orjson.dumps(RecordSigner(keys["attacker"], RULES).sign_record(d)),
                   "unknown_key"),
        "tampered": (orjson.dumps({**RecordSigner(keys["ops"], RULES).sign_record(d),
                                   "builtin": True}), "bad_signature"),
        "tombstone": (None, "unsigned"),
    }
    for name, (v, reason) in variants.items():
        before = REFUSALS.copy()
        assert not w.apply(v, name), name
        assert live.rules_version == rs.version, name
        assert (REFUSALS - before)[("rules", reason)] == 1, name
    assert w.apply(orjson.dumps(RecordSigner(keys["ops"], RULES).sign_record(d)), "signed")
    assert live.rules_version != rs.version  # the positive control: swapped
    assert len(w.ruleset.rules) == 1  # builtin: false honoured from a signed record


def test_unsigned_builtin_false_is_not_trusted_without_verification(tmp_path: Path) -> None:
    (tmp_path / "r.yaml").write_text("version: 1\nrules: []\n")
    value, _ = build_record([tmp_path / "r.yaml"], builtin=False)
    rs = builtin_ruleset()
    live = LiveRules(Matcher(rs), Policy(), rs.version)
    w = RulesWatcher("x:1", "p.rules", live, rs, {}, LOG, gate=RecordGate("rules", None, LOG))
    assert w.apply(value, "unsigned")
    assert len(w.ruleset.rules) == len(rs.rules)  # the built-in rules stay


# ---- logs records: the matcher checks the node signature -----------------------------------

def test_matcher_takes_only_records_signed_by_the_named_nodes_key(keys: dict[str, Any]) -> None:
    now = time.time()
    line = wire.encode_lines("J", 0, "n1", "r1", [Line("stderr", 0, now,
                                                       "NVRM: Xid (PCI:0000:3b:00): 79")])
    start = wire.encode_run_start(RunStart(job="J", attempt=0, node="n1", ts=now, run_id="r1"))
    dead: list[tuple[InRecord, Exception]] = []
    rs = builtin_ruleset()
    stage = MatcherStage(LiveRules(Matcher(rs), Policy(), rs.version),
                         lambda r, e: dead.append((r, e)),
                         node_verifier=NodeVerifier(keys["trust"]))
    n1, n2 = NodeSigner(keys["n1"]), NodeSigner(keys["n2"])
    bad_sig = [(k, v if k != "fw-sig" else bytes(64)) for k, v in n1.headers(line)]
    table: list[tuple[str, bytes, tuple[tuple[str, bytes], ...], str | None]] = [
        ("valid", line, tuple(n1.headers(line)), None),
        ("valid_start", start, tuple(n1.headers(start)), None),
        ("unsigned", line, (), "unsigned"),
        ("another_nodes_key", line, tuple(n2.headers(line)), "wrong_node"),
        ("processor_key", line, tuple(NodeSigner(keys["proc"]).headers(line)), "wrong_role"),
        ("unknown_key", line, tuple(NodeSigner(keys["attacker"]).headers(line)),
         "unknown_key"),
        ("tampered", line.replace(b"79", b"48"), tuple(n1.headers(line)), "bad_signature"),
        ("zero_signature", line, tuple(bad_sig), "bad_signature"),
    ]
    for i, (name, value, headers, reason) in enumerate(table):
        dead.clear()
        out = stage.process_batch([InRecord("p.logs", 0, i, b"k", value, headers)], now)
        if reason is None:
            assert out and not dead, name
        else:
            assert not out and len(dead) == 1, name
            assert f"refused ({reason})" in str(dead[0][1]), name


# ---- replayed and expired state records: registry and rules followers ----------------------

def test_registry_followers_refuse_an_old_record_written_again(keys: dict[str, Any],
                                                               tmp_path: Path) -> None:
    """Replayed: an old signed quarantine written again after the node's release (a new
    quarantine out of an old record) is refused by the processor's follower and by actuate,
    counted `replayed`; the release stays. Expired: a signed quarantine whose time is up
    drains nothing (actuate releases instead)."""
    now = time.time()
    proc, ops = RecordSigner(keys["proc"], NODE_RECORD), RecordSigner(keys["ops"], NODE_RECORD)
    old_q = proc.sign_record(orjson.loads(wire.encode_node(NodeRecord(
        node="n1", state="quarantined", until=now + 86400, strikes=1,
        updated_ts=now - 3600))))
    release = ops.sign_record(orjson.loads(wire.encode_node(NodeRecord(
        node="n1", state="healthy", strikes=1, updated_ts=now - 60))))
    fresh_q = proc.sign_record(orjson.loads(wire.encode_node(NodeRecord(
        node="n1", state="quarantined", until=now + 3600, strikes=2, updated_ts=now))))
    writer = RegistryWriter(gate=RecordGate("node_record", RecordVerifier(
        keys["trust"], NODE_RECORD), LOG))
    act = Actuator(NoBackend(), Journal(tmp_path / "j"),
                   ActuateConfig("x:1", "p.", tmp_path / "j", "g"))
    agate = RecordGate("node_record", RecordVerifier(keys["trust"], NODE_RECORD), LOG)

    def feed(rec: dict[str, Any], offset: int) -> None:
        writer.observe(b"n1", orjson.dumps(rec), where=str(offset))
        act.take_node(orjson.dumps(rec), now, agate, topic="p.nodes", partition=0,
                      offset=offset)

    feed(old_q, 0)  # in order: quarantined, then released
    feed(release, 1)
    assert writer.registry["n1"].state == act.registry["n1"].state == "healthy"
    before = REFUSALS.copy()
    feed(old_q, 2)  # the old quarantine written again
    assert writer.registry["n1"].state == act.registry["n1"].state == "healthy"
    assert (REFUSALS - before)[("node_record", "replayed")] == 2
    feed(fresh_q, 3)  # the positive control: a newer signed record is taken
    assert writer.registry["n1"].state == act.registry["n1"].state == "quarantined"
    # expired: a signed quarantine whose time is up is no quarantine
    expired = proc.sign_record(orjson.loads(wire.encode_node(NodeRecord(
        node="n2", state="quarantined", until=now - 1, strikes=1, updated_ts=now - 7200))))
    act.queue.clear()
    act.take_node(orjson.dumps(expired), now, agate, topic="p.nodes", partition=0, offset=4)
    assert [a.kind for a, _t, _n in act.queue if a.node == "n2"] == ["release"]
    assert writer.quarantined("n2", now) is None


def test_rules_follower_refuses_an_old_rule_set_written_again(keys: dict[str, Any],
                                                              tmp_path: Path) -> None:
    """An operator-signed rule set pushed an hour before the one in force, written again, is
    refused (`replayed`) and the newer set stays; a newer push is taken (positive control)."""
    ops = RecordSigner(keys["ops"], RULES)
    now = time.time()

    def push(name: str, at: float) -> bytes:
        (tmp_path / f"{name}.yaml").write_text(
            f"version: 1\nrules:\n- id: x.{name}\n  category: retryable\n  contains: {name}\n")
        value, _ = build_record([tmp_path / f"{name}.yaml"], now=at)
        return orjson.dumps(ops.sign_record(orjson.loads(value)))

    old, current, newer = push("old", now - 3600), push("current", now), push("newer", now + 1)
    rs = builtin_ruleset()
    live = LiveRules(Matcher(rs), Policy(), rs.version)
    w = RulesWatcher("x:1", "p.rules", live, rs, {}, LOG,
                     gate=RecordGate("rules", RecordVerifier(keys["trust"], RULES), LOG))
    assert w.apply(old, "0") and w.apply(current, "1")
    kept = live.rules_version
    before = REFUSALS.copy()
    assert not w.apply(old, "2")
    assert live.rules_version == kept
    assert (REFUSALS - before)[("rules", "replayed")] == 1
    assert w.apply(newer, "3") and live.rules_version != kept


def test_agent_refuses_a_decision_older_than_itself(keys: dict[str, Any],
                                                   tmp_path: Path) -> None:
    """Issue 36 item 2: agents of one launch derive one run id from its rendezvous endpoint,
    so a later launch at that endpoint has the same id. A decision whose evidence predates
    the agent (within the age window) is about an earlier launch: refused (before_start);
    one made after the agent started acts (the positive control)."""
    take = agent_consumer(keys, tmp_path)
    s = RecordSigner(keys["proc"], DECISION)
    now = time.time()
    before = REFUSALS.copy()
    assert not take(orjson.dumps(s.sign_record(decision(now - 30, id="b1", ts=now - 30))), 1)
    assert ("decision", "before_start") in REFUSALS - before
    assert take(orjson.dumps(s.sign_record(decision(now, id="b2"))), 2)
