"""Every record's shape, size budget and codec lives in wire/: no module elsewhere builds a
topic record, the dead letters and the rules record have their codecs there, and the
published JSON Schema of a decision agrees with wire/decisions.py, its one definition."""

from __future__ import annotations

import ast
import json
from pathlib import Path

import pytest

import faultwatch
from faultwatch.core.events import ACTIONS, Decision
from faultwatch.errors import DecodeError
from faultwatch.trust.keys import SigningKey
from faultwatch.trust.records import DECISION, RecordSigner
from faultwatch.wire import (
    MAX_ID_CHARS,
    MAX_ITEMS,
    MAX_RECORD_BYTES,
    deadletter,
    rules,
    signing,
    topics,
)
from faultwatch.wire import decisions as wd
from tests.support.source import modules

SCHEMA = json.loads((Path(faultwatch.__file__).parent / "schemas"
                     / "decision.schema.json").read_text())
# files, not topic records: the agent's --verdict-out file
NOT_TOPIC_RECORDS = {"faultwatch/agents/exitcodes.py"}


def _records_built(sources: list[tuple[str, str]]) -> list[str]:
    """`path:line` of each dict literal with a `v` (schema version) key outside wire/."""
    return [f"{path}:{n.lineno}" for path, src in sources
            if not path.startswith("faultwatch/wire/") and path not in NOT_TOPIC_RECORDS
            for n in ast.walk(ast.parse(src)) if isinstance(n, ast.Dict)
            and any(isinstance(k, ast.Constant) and k.value == "v" for k in n.keys)]


def test_no_record_is_built_outside_wire() -> None:
    assert _records_built(list(modules())) == []


def test_the_scan_finds_a_record_built_inline() -> None:
    planted = 'import orjson\nv = orjson.dumps({"v": 1, "topic": t, "error": e})\n'
    assert _records_built([("faultwatch/streams/x.py", planted)]) == ["faultwatch/streams/x.py:2"]


def test_every_topic_codec_is_a_wire_decoder() -> None:
    assert all(t.codec.startswith("faultwatch.wire.") for t in topics.TOPICS), \
        [t.codec for t in topics.TOPICS]


def test_a_dead_letter_round_trips_within_its_budget() -> None:
    big = bytes(range(256)) * 4000  # 1 MB of any bytes
    rec = deadletter.encode_dead("p.logs", 3, 77, "x" * 10_000, big)
    assert len(rec) < MAX_RECORD_BYTES
    d = deadletter.decode_dead(rec)
    assert (d["topic"], d["partition"], d["offset"]) == ("p.logs", 3, 77)
    assert d["value"] == big[:deadletter.MAX_DEAD_VALUE_BYTES]
    assert len(d["error"]) == deadletter.MAX_DEAD_ERROR_CHARS
    with pytest.raises(DecodeError):
        deadletter.decode_dead(b'{"topic": "t", "partition": 0, "offset": 1, "error": "e", '
                               b'"value_b64": "**"}')


def test_the_rules_record_round_trips_and_refuses_other_shapes() -> None:
    rec = rules.encode_ruleset("abc", [("site.yaml", "version: 1\n")], pushed_at=1.0,
                               builtin=True, push_id="p1", author="a@h", revision=3,
                               rollback_of=None)
    d = rules.decode_ruleset(rec)
    assert d["files"] == [{"name": "site.yaml", "text": "version: 1\n"}]
    assert d["revision"] == 3 and "rollback_of" not in d
    for bad in (None, b"[]", b'{"v": 2, "files": []}', b'{"v": 1, "files": [{"name": 1}]}'):
        with pytest.raises(DecodeError):
            rules.decode_ruleset(bad)
    assert rules.revision_key(13) == b"revision/3"


def _full() -> Decision:
    return Decision(id="0" * 20, job="j", attempt=1, action="blacklist", kind="error", ts=1.0,
                    nodes=("n1",), ranks=(0,), rule="r", category="hardware", message="m",
                    evidence={}, budgets={"restarts_used": 0, "max_restarts": 3},
                    rules_version="v", run_id="r1", scheduler={"kind": "slurm"},
                    run_ids=("r1", "r2"), swaps=(("n1", "s1"),))


def test_the_schema_names_exactly_the_fields_wire_writes() -> None:
    written = set(wd.decision_to_dict(_full())) | {signing.SIGNATURE_FIELD}
    assert set(SCHEMA["properties"]) == written
    assert set(SCHEMA["properties"]["reason"]["properties"]) >= {"kind", "rule", "category",
                                                                   "message"}


def test_the_schema_requires_what_the_decoder_requires() -> None:
    full = wd.decision_to_dict(_full())
    needed = set()
    for key in full:
        try:
            wd.decision_of({k: v for k, v in full.items() if k != key})
        except DecodeError:
            needed.add(key)
    # the schema may require more than the decoder reads (evidence, budgets and
    # rules_version are always written), never less
    assert needed <= set(SCHEMA["required"]), needed - set(SCHEMA["required"])
    assert set(SCHEMA["required"]) <= set(wd.decision_to_dict(
        Decision(id="0" * 20, job="j", attempt=0, action="fail", kind="error", ts=1.0)))


def test_the_schema_bounds_are_wires() -> None:
    p = SCHEMA["properties"]
    assert p["action"]["enum"] == list(ACTIONS)
    assert p["run_id"]["maxLength"] == MAX_ID_CHARS == p["run_ids"]["items"]["maxLength"]
    assert p["run_ids"]["maxItems"] == MAX_ITEMS
    assert p["swaps"]["maxItems"] == wd.MAX_SWAPS
    assert p["v"]["const"] == wd.SCHEMA_VERSION


def test_both_signatures_wire_writes_match_the_schema() -> None:
    jsonschema = pytest.importorskip("jsonschema")
    d = wd.decision_to_dict(_full())
    hmac_signed = signing.sign(d, signing.Keyring((signing.Key("k1", b"s" * 16),)))
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    sk = SigningKey("", Ed25519PrivateKey.generate(), "test")
    object.__setattr__(sk, "key_id", "0123456789abcdef")
    ed_signed = RecordSigner(sk, DECISION).sign_record(d)
    for rec in (d, hmac_signed, ed_signed):
        jsonschema.validate(json.loads(json.dumps(rec)), SCHEMA)
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate({**ed_signed, "signature": {**ed_signed["signature"], "mac": "x"}},
                            SCHEMA)
