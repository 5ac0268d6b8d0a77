"""The node registry core: quarantine backoff, expiry to probation, release, decision updates."""

from __future__ import annotations

import pytest

from faultwatch.cli.nodes import parse_duration_s
from faultwatch.core.events import Decision
from faultwatch.core.registry import (
    HEALTHY,
    MAX_REASONS,
    QUARANTINED,
    SUSPECT,
    NodeRecord,
    Reason,
    RegistryPolicy,
    expire,
    quarantine,
    quarantine_duration_s,
    registry_updates,
    release,
    suspect,
)
from faultwatch.errors import ConfigError, DecodeError
from faultwatch.readers.nodes import render
from faultwatch.registry.names import valid_node
from faultwatch.wire import decode_node, encode_node

POL = RegistryPolicy(quarantine_s=100.0, max_quarantine_s=350.0, probation_s=50.0)


def _r(did: str = "d1", ts: float = 0.0) -> Reason:
    return Reason(ts=ts, event="quarantine", decision=did, rule="nvidia-xid-hardware",
                  line="NVRM: Xid (PCI:0000:3b:00): 79, pid=1, GPU has fallen off the bus.")


def _blacklist(did: str = "abc", nodes: tuple[str, ...] = ("n1",), **ev: object) -> Decision:
    evidence = {"first_error": {"node": nodes[0] if nodes else "", "line": "NVRM: Xid 79"},
                **ev}
    return Decision(id=did, job="train", attempt=0, action="blacklist", kind="error", ts=1.0,
                    nodes=nodes, rule="nvidia-xid-hardware", category="hardware",
                    evidence=evidence)


def test_backoff_doubles_per_strike_and_is_capped() -> None:
    assert [quarantine_duration_s(k, POL) for k in (1, 2, 3, 4, 10_000)] == \
        [100.0, 200.0, 350.0, 350.0, 350.0]


def test_quarantine_expires_to_probation_then_healthy() -> None:
    rec = quarantine(None, "n1", 1000.0, _r(), POL)
    assert (rec.state, rec.until, rec.strikes) == (QUARANTINED, 1100.0, 1)
    assert expire(rec, 1099.9, POL) is rec  # nothing due: unchanged
    on_probation = expire(rec, 1100.0, POL)
    assert (on_probation.state, on_probation.probation, on_probation.until) == \
        (SUSPECT, True, 1150.0)
    assert expire(rec, 1150.0, POL).state == HEALTHY
    assert expire(rec, 1150.0, POL).strikes == 1  # expiry does not forget strikes


def test_repeat_during_probation_doubles() -> None:
    rec = quarantine(None, "n1", 0.0, _r("d1"), POL)
    rec = quarantine(rec, "n1", 120.0, _r("d2", 120.0), POL)  # expired at 100: on probation
    assert (rec.state, rec.strikes, rec.until) == (QUARANTINED, 2, 320.0)


def test_requarantine_while_quarantined_keeps_later_end_without_strike() -> None:
    rec = quarantine(None, "n1", 0.0, _r("d1"), POL)
    again = quarantine(rec, "n1", 10.0, _r("d2", 10.0), POL)
    assert (again.strikes, again.until) == (1, 100.0)
    longer = quarantine(rec, "n1", 10.0, _r("d3", 10.0), POL, duration_s=500.0)
    assert longer.until == 510.0


def test_suspect_does_not_lift_a_quarantine_and_release_does() -> None:
    rec = quarantine(None, "n1", 0.0, _r(), POL)
    assert suspect(rec, "n1", 1.0, _r("s"), POL).state == QUARANTINED
    assert suspect(None, "n2", 1.0, _r("s"), POL).state == SUSPECT
    rel = release(rec, "n1", 2.0, _r("m"))
    assert (rel.state, rel.until, rel.strikes) == (HEALTHY, None, 1)
    assert release(rec, "n1", 2.0, _r("m"), forget=True).strikes == 0


def test_history_is_bounded() -> None:
    rec = NodeRecord(node="n1")
    for i in range(MAX_REASONS + 5):
        rec = suspect(rec, "n1", float(i), _r(f"d{i}", float(i)), POL)
    assert len(rec.reasons) == MAX_REASONS
    assert rec.reasons[-1].decision == f"d{MAX_REASONS + 4}"


def test_registry_updates_quarantines_blacklisted_and_suspects_candidates() -> None:
    dec = _blacklist(blacklist_candidates=["n3", "n1"])
    ups = {r.node: r for r in registry_updates(dec, {}, 10.0, POL)}
    assert ups["n1"].state == QUARANTINED and ups["n1"].until == 110.0
    assert ups["n1"].reasons[-1].decision == "abc"
    assert ups["n1"].reasons[-1].rule == "nvidia-xid-hardware"
    assert ups["n1"].reasons[-1].line == "NVRM: Xid 79"
    assert ups["n3"].state == SUSPECT
    # replaying the same decision changes nothing
    assert registry_updates(dec, ups, 20.0, POL) == []
    # a restart decision quarantines nobody
    restart = Decision(id="r", job="train", attempt=0, action="restart", kind="error", ts=1.0,
                       nodes=("n1",))
    assert registry_updates(restart, {}, 1.0, POL) == []


def test_record_roundtrip_and_bad_records_are_named() -> None:
    rec = quarantine(None, "n1", 0.0, _r(), POL)
    assert decode_node(encode_node(rec)) == rec
    for bad, what in ((b"{", "not JSON"), (b"[]", "not a JSON object"),
                      (b'{"v":1,"t":"node","node":"n1","state":"broken","strikes":0}', "state"),
                      (b'{"v":1,"t":"node","node":"n1","state":"healthy","strikes":-1}',
                       "strikes"),
                      (b'{"v":1,"t":"node","node":"n\\u0000","state":"healthy","strikes":0}',
                       "node"),
                      (b'{"v":1,"t":"node","node":"n1","state":"quarantined","strikes":1,'
                       b'"until":"soon"}', "until"),
                      (b'{"v":2,"t":"node"}', "v=2")):
        with pytest.raises(DecodeError, match=what):
            decode_node(bad)


def test_cli_json_has_the_contract_fields() -> None:
    import orjson

    rec = quarantine(None, "n1", 0.0, _r(), POL)
    (line,) = render({"n1": rec}, 1.0, as_json=True)
    d = orjson.loads(line)
    assert {"node", "state", "until", "strikes", "reasons"} <= set(d)
    assert d["state"] == "quarantined"


def test_durations_and_node_names() -> None:
    assert parse_duration_s("90") == 90.0
    assert parse_duration_s("30m") == 1800.0
    assert parse_duration_s("1h30m") == 5400.0
    assert parse_duration_s("2d") == 172800.0
    for bad in ("", "1x", "-5m", "0s", "m"):
        with pytest.raises(ConfigError):
            parse_duration_s(bad)
    assert valid_node("gpu-001.cluster") == "gpu-001.cluster"
    for bad in ("-n1", "n1;reboot", "n 1", "", "a" * 300, "n1\n"):
        with pytest.raises(ConfigError):
            valid_node(bad)


def test_writer_folds_the_topic_and_emits_records_for_its_decisions() -> None:
    from faultwatch.registry.writer import RegistryWriter
    from faultwatch.wire import node_key

    w = RegistryWriter(POL)
    earlier = quarantine(None, "n1", 0.0, _r("old"), POL)
    w.observe(node_key("n1"), encode_node(earlier))
    w.observe(node_key("n9"), b"garbage")  # logged, skipped
    assert w.quarantined("n1", 50.0) is not None
    assert w.quarantined("n1", 100.0) is None  # expired: probation, not quarantine
    out = w.updates([_blacklist("new")], 200.0)  # on probation -> second strike, doubled
    ((key, value),) = out
    rec = decode_node(value)
    assert key == b"n1" and rec.strikes == 2 and rec.until == 400.0
    assert w.updates([_blacklist("new")], 201.0) == []  # replay: nothing
    w.observe(node_key("n1"), None)  # tombstone
    assert "n1" not in w.registry
