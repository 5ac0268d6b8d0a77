"""What the workers announce of their trust policy, and the check an operator's command makes
against it before writing (issue 36 item 3): a write a verifying worker would refuse is
refused by the command; a worker without a trust file takes anything."""

from __future__ import annotations

from pathlib import Path

from faultwatch.trust.announce import announcement, check_write
from faultwatch.trust.records import HOLD, NODE_RECORD, RULES
from tests.unit.trust.helpers import make_key, trust_of


def test_the_announcement_names_key_ids_never_keys(tmp_path: Path) -> None:
    ops, ops_line = make_key(tmp_path, "operator", "ops")
    proc, proc_line = make_key(tmp_path, "processor", "p")
    _, node_line = make_key(tmp_path, "node", "gpu-1")
    a = announcement(trust_of(ops_line, proc_line, node_line))
    assert a == {"verifies": ["rules", "node", "hold", "logs"],
                 "keys": {"operator": [ops.key_id], "processor": [proc.key_id]},
                 "node_keys": 1}
    assert announcement(trust_of(ops_line))["verifies"] == ["rules", "node", "hold"]
    assert announcement(None) == {"verifies": [], "keys": {}, "node_keys": 0}


def test_a_write_is_refused_only_where_a_live_worker_would_refuse_it(tmp_path: Path) -> None:
    ops, ops_line = make_key(tmp_path, "operator", "ops")
    proc, proc_line = make_key(tmp_path, "processor", "p")
    stranger, _ = make_key(tmp_path, "operator", "stranger")
    strict = {"trust": announcement(trust_of(ops_line, proc_line))}
    workers = {"w1": strict, "w2": {"trust": announcement(None)}}
    c = check_write(RULES, None, workers)
    assert c.refused and c.refusing == {"w1": "unsigned"} and c.workers == 2
    msg = c.message(None)
    assert "1 of 2 processor worker(s) verify rule sets" in msg and "(w1)" in msg
    assert "--signing-key-file" in msg and "FAULTWATCH_SIGNING_KEY_FILE" in msg
    assert not check_write(RULES, ops.key_id, workers).refused  # positive control
    c = check_write(RULES, stranger.key_id, workers)
    assert c.refusing == {"w1": "its trust file does not list the key for operator"}
    assert f"signed by key {stranger.key_id}" in c.message(stranger.key_id)
    assert check_write(RULES, proc.key_id, workers).refused  # a processor may not sign rules
    assert not check_write(NODE_RECORD, proc.key_id, workers).refused  # ... registry records
    assert check_write(HOLD, None, workers).refused
    # no trust file anywhere, or no worker at all: nothing to refuse
    assert not check_write(RULES, None, {"w2": workers["w2"]}).refused
    assert not check_write(RULES, None, {}).refused
    older = check_write(RULES, None, {"old": {"rules": {}}})
    assert not older.refused and older.silent == ["old"]
