"""The node gate: a run-start on a quarantined node and failed or odd checks become hardware
hits the job stage applies; core turns them into a blacklist of that node."""

from __future__ import annotations

from typing import Any

from faultwatch.agents.bootcheck import check
from faultwatch.core.events import Heartbeat, Hit, Notice, RunStart
from faultwatch.core.job import apply, new_state
from faultwatch.core.policy import Policy
from faultwatch.core.registry import NodeRecord, Reason, RegistryPolicy, quarantine
from faultwatch.registry.gate import (
    CHECK_FAILED_RULE,
    CHECK_ODD_RULE,
    QUARANTINED_RULE,
    NodeGate,
)
from faultwatch.registry.writer import RegistryWriter
from faultwatch.wire import encode_node, node_key
from tests.support.rules import builtin_ruleset

POL = Policy(settle_s=1.0)


def _start(node: str, attempt: int = 0, ts: float = 100.0, rank: int = 0) -> RunStart:
    return RunStart("job", attempt, node, ts, run_id="r1", run_source="flag", rank=rank,
                    nnodes=1)


def _note(node: str, checks: list[dict[str, Any]], attempt: int = 0, rank: int = 0,
          ts: float = 99.0) -> Notice:
    return Notice("job", attempt, node, ts, "bootcheck",
                  {"ok": all(c["ok"] for c in checks), "checks": checks, "rank": rank},
                  run_id="r1")


def _decide(sigs: list[Any]) -> list[Any]:
    """Apply signals to a fresh state, then heartbeats past the settle horizon."""
    st = new_state(sigs[0])
    decs: list[Any] = []
    assert st is not None
    for s in sigs:
        st, d = apply(st, s, 200.0, POL)
        decs += d
    for node in sorted(st.nodes):
        st, d = apply(st, Heartbeat("job", st.attempt, node, 110.0, True, 105.0, 100.0,
                                    run_id="r1"), 200.0, POL)
        decs += d
    return decs


def _quarantined_registry(node: str) -> RegistryWriter:
    w = RegistryWriter()
    rec = quarantine(None, node, 50.0, Reason(ts=50.0, event="quarantine", decision="d0",
                                              rule="nvidia-xid-79", line="Xid 79 fell off"),
                     RegistryPolicy(), duration_s=3600.0)
    w.observe(node_key(node), encode_node(rec))
    return w


def test_a_run_start_on_a_quarantined_node_is_blacklisted_and_a_healthy_one_is_not() -> None:
    w = _quarantined_registry("bad")
    gate = NodeGate(w.quarantined)
    out = gate([_start("bad")], 100.0)
    assert len(out) == 2 and isinstance(out[1], Hit)
    m = out[1].match
    assert (m.rule, m.category, m.action) == (QUARANTINED_RULE, "hardware", "blacklist")
    assert "quarantined until" in m.line and "nvidia-xid-79" in m.line and "1 strike" in m.line
    decs = _decide(out)
    assert [(d.action, d.nodes, d.rule) for d in decs] == [("blacklist", ("bad",),
                                                            QUARANTINED_RULE)]
    assert gate([_start("good")], 100.0) == [_start("good")]  # positive control
    # the quarantine is over at `until`: the node may start again (on probation)
    assert len(gate([_start("bad", 1)], 50.0 + 3600.0 + 1)) == 1


def test_a_failed_check_before_the_launch_blacklists_the_node_after_its_run_start() -> None:
    gate = NodeGate()
    bad = _note("n1", [check("disk:/scratch", False, None, "OSError: [Errno 30] read-only")])
    assert gate([bad], 100.0) == [bad]  # held: the state has no run-start of it yet
    out = gate([_start("n1")], 100.0)
    assert [type(s).__name__ for s in out] == ["RunStart", "Hit"]
    hit = out[1]
    assert isinstance(hit, Hit) and hit.match.rule == CHECK_FAILED_RULE
    assert "disk:/scratch: OSError" in hit.match.line and hit.run_id == "r1"
    decs = _decide(out)
    assert [(d.action, d.nodes) for d in decs] == [("blacklist", ("n1",))]
    # a check of a node already running (on demand) is passed on at once; passing: nothing
    assert len(gate([bad], 100.0)) == 2
    ok = _note("n1", [check("disk:/scratch", True, {"write_mb_s": 1})])
    assert gate([ok], 100.0) == [ok]


def test_the_odd_node_of_a_job_is_named_with_rank_0_as_the_reference() -> None:
    gate = NodeGate()
    gate([_start("n0", rank=0), _start("n1", rank=1)], 100.0)
    a = _note("n0", [check("torch", True, "2.5.1"), check("python", True, "3.12.3")], rank=0)
    b = _note("n1", [check("torch", True, "2.4.0"), check("python", True, "3.12.3")], rank=1)
    assert gate([a], 100.0) == [a]
    out = gate([b], 100.0)
    hits = [s for s in out if isinstance(s, Hit)]
    assert [(h.node, h.match.rule) for h in hits] == [("n1", CHECK_ODD_RULE)]
    assert "torch is '2.4.0'" in hits[0].match.line and "'2.5.1'" in hits[0].match.line
    assert gate([b], 100.0) == [b]  # reported once per attempt


def test_a_slow_all_reduce_makes_a_suspect_not_a_blacklist() -> None:
    gate = NodeGate()
    gate([_start("n0", rank=0), _start("n1", rank=1), _start("n2", rank=2)], 100.0)
    for n, bw in (("n0", 10.0), ("n1", 11.0), ("n2", 2.0)):
        out = gate([_note(n, [check("allreduce", True, {"ok": True, "busbw_gb_s": bw})],
                          rank=int(n[1]))], 100.0)
    assert not any(isinstance(s, Hit) for s in out)
    slow = [s for s in out[1:] if isinstance(s, Notice)]
    assert len(slow) == 1 and slow[0].node == "n2" and slow[0].data["ok"] is False
    st = new_state(_start("n2"))
    assert st is not None
    st, _ = apply(st, _start("n2"), 100.0, POL)
    st, decs = apply(st, slow[0], 100.0, POL)
    assert [(d.action, d.evidence["blacklist_candidate"]) for d in decs] == [("notify", True)]
    from faultwatch.core.registry import SUSPECT, registry_updates
    recs = registry_updates(decs[0], {}, 100.0)
    assert [(r.node, r.state) for r in recs] == [("n2", SUSPECT)]


def test_writer_quarantines_on_its_blacklist_once() -> None:
    w = RegistryWriter()
    gate = NodeGate(w.quarantined)
    bad = _note("n1", [check("gpus", False, None, "expected 8 GPUs, torch sees 7")])
    assert gate([bad], 100.0) == [bad]
    decs = _decide(gate([_start("n1")], 100.0))
    ups = w.updates(decs, 200.0)
    assert len(ups) == 1 and w.quarantined("n1", 201.0) is not None
    assert w.updates(decs, 202.0) == []  # replayed decision: no second strike
    rec: NodeRecord = w.registry["n1"]
    assert rec.strikes == 1 and rec.reasons[-1].rule == CHECK_FAILED_RULE


def test_a_node_that_aborts_on_a_failed_check_is_blacklisted_in_a_running_job() -> None:
    gate = NodeGate()
    gate([_start("n0", rank=0)], 100.0)  # n0 runs attempt 0; n1 never starts (abort, 138)
    bad = _note("n1", [check("gpus", False, None, "nvidia-smi lists 8 GPUs, torch sees 7")])
    out = gate([bad], 100.0)
    assert [type(s).__name__ for s in out] == ["Notice", "Hit"] and out[1].node == "n1"
    assert out[1].run_id == "r1"
    assert gate([_start("n1", rank=1)], 100.0) == [_start("n1", rank=1)]  # not twice
    # another attempt's run does not take it: held for the node's own run-start
    late = _note("n1", [check("gpus", False, None, "x")], attempt=1)
    assert gate([late], 100.0) == [late]
    assert len(gate([_start("n1", attempt=1)], 100.0)) == 2


def test_embedded_mode_decides_a_failed_check_in_memory() -> None:
    from faultwatch.streams.local import LocalPipeline
    from faultwatch.wire import encode_heartbeat, encode_notice, encode_run_start, log_key

    pipe = LocalPipeline(builtin_ruleset(), Policy(settle_s=1.0))
    key = log_key("job", "n1")
    pipe.submit(key, encode_notice("job", 0, "n1", 99.0, "bootcheck", {
        "ok": False, "checks": [check("disk:/d", False, None, "OSError: EIO")]},
        run_id="r1"), 100.0)
    assert pipe.submit(key, encode_run_start(_start("n1")), 100.0) == []
    decs = pipe.submit(key, encode_heartbeat(Heartbeat("job", 0, "n1", 110.0, True, 100.0,
                                                       100.0, run_id="r1")), 110.0)
    assert [(d.action, d.nodes, d.rule) for d in decs] == [("blacklist", ("n1",),
                                                            CHECK_FAILED_RULE)]
    assert pipe.nodes.quarantined("n1", 111.0) is not None  # the in-memory registry


def test_a_failed_all_reduce_across_nodes_blames_no_node_but_a_local_one_does() -> None:
    gate = NodeGate()
    gate([_start("n0")], 100.0)
    timeout = {**check("allreduce", False, None, "timed out after 115s"), "scope": "job"}
    note = _note("n0", [timeout])
    assert gate([note], 100.0) == [note]  # every rank times out alike: names no node
    wrong = {**check("allreduce", False, {"ok": False, "world_size": 2}, "wrong sum"),
             "scope": "node"}
    out = gate([_note("n0", [wrong])], 100.0)
    assert [s.match.rule for s in out if isinstance(s, Hit)] == [CHECK_FAILED_RULE]


def test_a_note_of_a_node_outside_the_run_does_not_take_another_nodes_run_id() -> None:
    """Issue 35 item 1: nodeA never started VICTIM; its failed-check note (signed by its own
    key, with its own generated run id) named VICTIM's attempt. Before: the gate gave the
    verdict the run id of VICTIM's node, and the blacklist of nodeA restarted VICTIM. Now
    the verdict keeps the note's own id, which the job state refuses (another run)."""
    gate = NodeGate()
    victim = _start("nodeB")
    attack = Notice("job", 0, "nodeA", 99.0, "bootcheck",
                    {"ok": False, "checks": [check("gpus", False, None, "x")], "rank": 0},
                    run_id="g-attacker")
    sigs = gate([victim], 100.0) + gate([attack], 100.0)
    verdict = sigs[-1]
    assert isinstance(verdict, Hit) and verdict.node == "nodeA"
    assert verdict.run_id == "g-attacker"
    st = new_state(victim)
    assert st is not None
    decs: list[Any] = []
    for s in sigs:
        st, d = apply(st, s, 200.0, POL)
        decs += d
    st, d = apply(st, Heartbeat("job", 0, "nodeB", 110.0, True, 105.0, 100.0, run_id="r1"),
                  200.0, POL)
    assert decs + d == [] and set(st.nodes) == {"nodeB"}


def test_a_spares_note_carries_the_registrys_word_and_its_checks_blame_no_job() -> None:
    w = _quarantined_registry("bad")
    gate = NodeGate(w.quarantined, w.state)
    said = Notice("job", 0, "bad", 100.0, "spare", {"checks": "passed", "registry": "healthy"},
                  run_id="r1")
    [out] = gate([said], 100.0)
    assert isinstance(out, Notice) and out.data["registry"] == "quarantined"  # not its own
    [ok] = gate([Notice("job", 0, "good", 100.0, "spare", {}, run_id="r1")], 100.0)
    assert isinstance(ok, Notice) and ok.data["registry"] == "healthy"
    # without a state lookup (older wiring) the quarantine still shows
    [out] = NodeGate(w.quarantined)([said], 100.0)
    assert isinstance(out, Notice) and out.data["registry"] == "quarantined"
    # a waiting spare's failed check is no hardware hit of the job; an active node's is
    failed = [check("disk:/x", False, detail="NotADirectoryError")]
    spare_checks = _note("c", failed)
    spare_checks = Notice(spare_checks.job, 0, "c", 99.0, "bootcheck",
                          {**spare_checks.data, "when": "spare"}, run_id="r1")
    assert gate([_start("a"), spare_checks], 100.0) == [_start("a"), spare_checks]
    assert any(isinstance(s, Hit) for s in gate([_note("a", failed)], 100.0))
