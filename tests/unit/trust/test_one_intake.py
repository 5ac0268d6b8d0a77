"""One decision intake and one signature gate: the consumers that act on decisions (the
agent's follower, actuate, notify) take records through trust/intake.py, and every
signature check of a consumer goes through trust/records.RecordGate (DecisionGate is it,
preset for decisions). tests/unit/trust/test_consumers_table.py shows the three refuse the
same records alike."""

from __future__ import annotations

import ast
from typing import Any

from faultwatch.trust.intake import DecisionIntake
from faultwatch.trust.records import DecisionGate, RecordGate
from faultwatch.trust.replay import ReplayGuard
from faultwatch.wire import signing
from tests.support.source import modules

CONSUMERS = ("faultwatch/agents/", "faultwatch/actuate/", "faultwatch/notify/")
INTAKE_CALLS = {"decode_decision", "decision_of", "check"}  # decode, and replay.check(...)


def _calls(source: str) -> set[str]:
    out = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Call):
            f = node.func
            name = f.attr if isinstance(f, ast.Attribute) else getattr(f, "id", "")
            if name == "check" and not (isinstance(f, ast.Attribute)
                                        and getattr(f.value, "attr", "") == "replay"):
                continue  # only replay.check(...) is the intake's
            out.add(name)
    return out


# the follower's offer() turns a dict it is handed into a Decision: that call alone is allowed
ALLOWED = {"faultwatch/agents/decisions.py": {"decision_of"}}


def _second_intakes(sources: list[tuple[str, str]]) -> list[str]:
    found = ((path, _calls(src) & INTAKE_CALLS - ALLOWED.get(path, set()))
             for path, src in sources if path.startswith(CONSUMERS))
    return sorted(f"{path}: {sorted(calls)}" for path, calls in found if calls)


def test_no_consumer_decodes_or_replay_checks_a_decision_itself() -> None:
    """The follower's offer() still turns a dict it is handed into a Decision (decision_of):
    it is the one allowed exception, listed by path above."""
    assert _second_intakes(list(modules())) == []


def test_the_scan_finds_a_planted_second_intake() -> None:
    planted = ("from faultwatch.wire import decode_decision\n"
               "def take(self, v):\n    d = decode_decision(v)\n"
               "    return self.replay.check(d.id, d.ts, 0.0)\n")
    assert _second_intakes([("faultwatch/notify/x.py", planted)]) == [
        "faultwatch/notify/x.py: ['check', 'decode_decision']"]
    # the follower may turn a dict into a Decision, never replay-check it itself
    assert _second_intakes([("faultwatch/agents/decisions.py", planted)]) == [
        "faultwatch/agents/decisions.py: ['check', 'decode_decision']"]


def test_one_gate_class() -> None:
    gates = [(path, n.name) for path, src in modules() for n in ast.walk(ast.parse(src))
             if isinstance(n, ast.ClassDef) and n.name.endswith("Gate")
             and any(isinstance(b, ast.Name) and b.id in ("object",) for b in n.bases) is False
             and "admit" in {f.name for f in n.body if isinstance(f, ast.FunctionDef)}]
    assert gates == [("faultwatch/trust/records.py", "RecordGate")]
    assert issubclass(DecisionGate, RecordGate)


def test_the_intake_logs_each_refusal_under_one_name() -> None:
    events: list[tuple[str, dict[str, Any]]] = []
    ring = signing.Keyring((signing.Key("k1", b"s" * 16),))
    intake = DecisionIntake(DecisionGate(ring, lambda e, **f: events.append((e, f))),
                            ReplayGuard("decision", 600.0),
                            lambda e, **f: events.append((e, f)))
    good = {"v": 1, "id": "d1", "job": "j", "attempt": 0, "action": "notify",
            "targets": {"nodes": [], "ranks": []}, "reason": {"kind": "error", "message": "m"},
            "evidence": {}, "budgets": {}, "rules_version": "", "ts": 1000.0}
    where = {"topic": "t", "partition": 0}
    assert intake.take(signing.encode(good, ring), 1000.0, offset=1, **where) is not None
    assert intake.take(signing.encode(good, ring), 1000.0, offset=2, **where) is None  # again
    assert intake.take(signing.encode(good, None), 1000.0, offset=3, **where) is None
    assert intake.take(signing.encode({"x": 1}, ring), 1000.0, offset=4, **where) is None
    assert intake.take(signing.encode({**good, "id": "d2", "ts": 1.0}, ring), 1000.0,
                       offset=5, **where) is None
    assert [(e, f.get("reason")) for e, f in events] == [
        ("decision_refused", "replayed"), ("decision_refused", "unsigned"),
        ("undecodable_decision", None), ("decision_refused", "too_old")]
    assert intake.bad == 1
