"""Signed decisions: forgery, rotation and tampering with every field are caught."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import orjson
import pytest

from faultwatch.errors import ConfigError
from faultwatch.trust.records import DecisionGate
from faultwatch.wire import signing
from faultwatch.wire.signing import Key, Keyring, sign, verify

OLD = Key("k2025", b"old-secret-0123456789")
NEW = Key("k2026", b"new-secret-0123456789")


def decision() -> dict[str, Any]:
    return {"v": 1, "id": "job1/1/fail/error/0", "job": "job1", "attempt": 1, "action": "fail",
            "targets": {"nodes": ["n1", "n2"], "ranks": [0, 3]},
            "reason": {"kind": "error", "rule": "cuda.oom", "category": "fatal",
                       "message": "CUDA out of memory"},
            "evidence": {"first_error": {"node": "n1", "rank": 0, "ts": 17.25,
                                         "lines": ["RuntimeError: CUDA out of memory", "é✓"]}},
            "budgets": {"restarts_used": 1, "restarts_max": 3}, "rules_version": "abc123",
            "ts": 1763850000.125, "run_id": "slurm-42", "scheduler": {"kind": "slurm"}}


def wire_round_trip(d: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = orjson.loads(orjson.dumps(d))  # what a consumer decodes
    return out


def test_a_signed_decision_verifies_after_the_wire() -> None:
    signed = sign(decision(), Keyring((NEW,)))
    assert signed["signature"]["key_id"] == "k2026"
    assert signed["signature"]["alg"] == "HMAC-SHA256"
    v = verify(wire_round_trip(signed), Keyring((NEW,)))
    assert v.ok and v.reason == signing.SIGNED and v.key_id == "k2026"


def test_key_order_does_not_matter_but_content_does() -> None:
    signed = sign(decision(), Keyring((NEW,)))
    reordered = dict(reversed(list(signed.items())))
    assert verify(reordered, Keyring((NEW,))).ok


def test_unsigned_and_forged_decisions_are_refused() -> None:
    ring = Keyring((NEW,))
    assert verify(decision(), ring).reason == signing.UNSIGNED
    forged = sign(decision(), Keyring((Key("k2026", b"attacker-guess-0123456789"),)))
    v = verify(forged, ring)
    assert not v.ok and v.reason == signing.BAD_SIGNATURE and v.key_id == "k2026"
    other = sign(decision(), Keyring((Key("mine", b"attacker-guess-0123456789"),)))
    assert verify(other, ring).reason == signing.UNKNOWN_KEY


@pytest.mark.parametrize("sig", [
    "deadbeef", {"alg": "HMAC-SHA256", "key_id": "k2026"},
    {"alg": "HMAC-MD5", "key_id": "k2026", "mac": "00"},
    {"alg": "HMAC-SHA256", "key_id": 7, "mac": "00"},
])
def test_malformed_signatures_are_refused(sig: Any) -> None:
    d = {**decision(), "signature": sig}
    assert verify(d, Keyring((NEW,))).reason == signing.MALFORMED


def _tamperings() -> list[tuple[str, Any]]:
    out: list[tuple[str, Any]] = []
    for key, value in decision().items():
        if isinstance(value, str):
            out.append((key, value + "x"))
        elif isinstance(value, bool | int | float):
            out.append((key, value + 1))
        else:
            out.append((key, None))
    return out + [("targets.nodes", ["n2"]), ("evidence.first_error.lines", ["ok"]),
                  ("extra", "added"), ("reason.message", "all fine")]


@pytest.mark.parametrize("path,value", _tamperings())
def test_tampering_with_any_field_breaks_the_signature(path: str, value: Any) -> None:
    signed = sign(decision(), Keyring((NEW,)))
    tampered = copy.deepcopy(signed)
    *parents, last = path.split(".")
    node = tampered
    for p in parents:
        node = node[p]
    if value is None:
        del node[last]
    else:
        node[last] = value
    assert verify(tampered, Keyring((NEW,))).reason == signing.BAD_SIGNATURE


def test_rotation_accepts_both_keys_then_drops_the_old_one() -> None:
    by_old = sign(decision(), Keyring((OLD,)))
    by_new = sign(decision(), Keyring((NEW, OLD)))  # the processor switched to the new key
    during = Keyring((NEW, OLD))
    assert verify(by_old, during).ok and verify(by_new, during).ok
    after = Keyring((NEW,))
    assert verify(by_new, after).ok
    assert verify(by_old, after).reason == signing.UNKNOWN_KEY


def test_keys_load_from_a_file_and_the_environment(tmp_path: Path) -> None:
    f = tmp_path / "keys"
    f.write_text("# current first\nk2026 new-secret-0123456789\nk2025:old-secret-0123456789\n")
    ring = signing.load_keyring(env={signing.KEY_FILE_ENV: str(f)})
    assert ring is not None and [k.key_id for k in ring.keys] == ["k2026", "k2025"]
    assert ring.signing_key.secret == b"new-secret-0123456789"
    ring = signing.load_keyring(env={signing.KEY_ENV: "a:0123456789abcdef:x, b:fedcba9876543210"})
    assert ring is not None and ring.get("a") == Key("a", b"0123456789abcdef:x")
    assert signing.load_keyring(env={}) is None


@pytest.mark.parametrize("text,match", [
    ("k1 short", "at least 16"), ("bad/id 0123456789abcdef", "key id"),
    ("k1 0123456789abcdef\nk1 0123456789abcdefg", "given twice"), ("# nothing", "no keys"),
    ("lonely", "entry 1"),
])
def test_bad_key_files_say_what_is_wrong(tmp_path: Path, text: str, match: str) -> None:
    f = tmp_path / "keys"
    f.write_text(text)
    with pytest.raises(ConfigError, match=match):
        signing.load_keyring(f)
    assert "0123456789abcdef" not in repr(Keyring((Key("k", b"0123456789abcdef"),)))


def test_the_gate_refuses_and_says_so_or_warns_once_without_a_key() -> None:
    events: list[tuple[str, dict[str, Any]]] = []

    def log(event: str, **fields: Any) -> None:
        events.append((event, fields))

    gate = DecisionGate(Keyring((NEW,)), log)
    assert gate.admit(wire_round_trip(sign(decision(), Keyring((NEW,)))), offset=1)
    assert not gate.admit(decision(), topic="t", partition=0, offset=2)
    assert events == [("decision_refused", {
        "reason": "unsigned", "detail": "the decision carries no signature", "key_id": None,
        "id": "job1/1/fail/error/0", "job": "job1", "action": "fail", "topic": "t",
        "partition": 0, "offset": 2})]
    assert gate.refused == 1
    events.clear()
    open_gate = DecisionGate(None, log)
    assert open_gate.admit(decision()) and open_gate.admit(decision())
    assert [e for e, _ in events] == ["decisions_unverified"]


def test_the_gate_checks_raw_records_as_published() -> None:
    events: list[tuple[str, dict[str, Any]]] = []
    gate = DecisionGate(Keyring((NEW,)), lambda e, **f: events.append((e, f)))
    assert gate.admit_record(signing.encode(decision(), Keyring((NEW,))), offset=1)
    assert not gate.admit_record(signing.encode(decision(), None), offset=2)
    assert not gate.admit_record(b"[1, 2]", offset=3)
    assert not gate.admit_record(None, offset=4)
    assert [f["reason"] for _, f in events] == ["unsigned", "malformed_signature",
                                                "malformed_signature"]
    assert DecisionGate(None, lambda e, **f: None).admit_record(b"garbage")


def test_a_signed_decision_matches_the_published_schema() -> None:
    jsonschema = pytest.importorskip("jsonschema")
    schema = orjson.loads((Path(signing.__file__).parents[1] / "schemas"
                           / "decision.schema.json").read_bytes())
    signed = sign(decision(), Keyring((NEW,)))
    jsonschema.validate(signed["signature"], schema["properties"]["signature"])
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate({**signed["signature"], "mac": "zz"},
                            schema["properties"]["signature"])
