"""Hot spares in the pure core: registration, which spare replaces which node (and when none
may), liveness of waiting spares, and the swap carried by blacklist and node-lost decisions."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from faultwatch.core.events import Heartbeat, Notice, RunStart
from faultwatch.core.folds import new_attempt
from faultwatch.core.job import DECIDED, JobState, apply, tick
from faultwatch.core.pmap import PMap
from faultwatch.core.policy import Policy
from faultwatch.core.spares import plan
from tests.support.job_events import hit, start

P = Policy(settle_s=1, blacklist_s=100, max_restarts=10, node_lost_s=30)


def note(st: JobState, node: str, ts: float, now: float | None = None, policy: Policy = P,
         attempt: int = 0, **data: Any) -> tuple[JobState, list]:
    return apply(st, Notice("j", attempt, node, ts, "spare", data), ts if now is None else now,
                 policy)


def xid_on(st: JobState, bad: str, t: float, others: tuple[str, ...], attempt: int = 0,
           policy: Policy = P) -> tuple[JobState, list]:
    """A hardware hit on `bad`, settled by every node's heartbeat settle_s later."""
    st, _ = apply(st, hit("nvidia-xid-79", "hardware", t, node=bad, attempt=attempt), t, policy)
    decs: list = []
    for n in (bad, *others):
        st, d = apply(st, Heartbeat("j", attempt, n, t + 1.5, True, t), t + 1.5, policy)
        decs += d
    return st, decs


def two_and_spares(*spares: str, **data: Any) -> JobState:
    st = start(("a", "b"), policy=P)
    for i, s in enumerate(spares):
        st, decs = note(st, s, 100.0 + i, checks="passed", **data)
        assert decs == []
    return st


def test_a_blacklisted_node_is_replaced_by_a_checked_spare_and_nobody_requeues() -> None:
    st = two_and_spares("c")
    assert set(st.spares) == {"c"} and set(st.nodes) == {"a", "b"}  # a spare is no node
    st, decs = xid_on(st, "b", 110.0, ("a",))
    [d] = decs
    assert (d.action, d.nodes, d.swaps) == ("blacklist", ("b",), (("b", "c"),))
    assert d.evidence["restart_nodes"] == ["a", "c"]  # the survivor and the spare relaunch
    assert d.evidence["spares"]["swapped"] is True
    assert "swapped in spare c for b" in d.message
    assert st.spares["c"].state == "taken" and st.spares["c"].taken_for == "b"
    # the spare's run-start of the next attempt makes it an active node, no spare
    st = new_attempt(st, 1)
    st, _ = apply(st, RunStart("j", 1, "c", 120.0), 120.0, P)
    assert "c" in st.nodes and "c" not in st.spares


def test_without_a_usable_spare_the_blacklist_is_todays_and_says_why() -> None:
    st = two_and_spares("c", "d")
    st, _ = note(st, "c", 105.0, checks="failed", failed=["disk:/scratch"])
    st, _ = note(st, "d", 105.0, checks="passed", registry="quarantined")
    st, [d] = xid_on(st, "b", 110.0, ("a",))
    assert (d.action, d.swaps) == ("blacklist", ())
    assert d.evidence["restart_nodes"] == ["a", "b"]  # as without spares: b exits 138
    sp = d.evidence["spares"]
    assert sp["swapped"] is False and "0 spare(s) may replace one" in sp["why"]
    assert sp["spares"]["c"]["why_not"] == "boot checks failed: disk:/scratch"
    assert sp["spares"]["d"]["why_not"] == "quarantined in the node registry"


def test_a_run_without_spares_gets_no_spare_evidence() -> None:
    st, [d] = xid_on(start(("a", "b"), policy=P), "b", 110.0, ("a",))
    assert d.swaps == () and "spares" not in d.evidence


def test_each_refusal_keeps_a_spare_out() -> None:
    """Every reason a spare may not replace a node, each alone beside a positive control."""
    base = two_and_spares("c")  # c's last note at 100 (processor time 100)
    assert plan(base, ("b",), 110.0, P)[0] == (("b", "c"),)  # positive control
    refusals = {
        "silent for 40s": (base, 140.0),  # past node_lost_s (30 s)
        "another job's spare runs on it (job other)":
            (note(base, "c", 105.0, checks="passed", busy="job other")[0], 110.0),
        "blacklisted by this job": (replace(base, blacklist=PMap({"c": (1, 500.0)})), 110.0),
        "boot checks failed: gpus":
            (note(base, "c", 105.0, checks="failed", failed=["gpus"])[0], 110.0),
        "quarantined in the node registry":
            (note(base, "c", 105.0, checks="passed", registry="quarantined")[0], 110.0),
    }
    for why, (st, at) in refusals.items():
        swaps, ev = plan(st, ("b",), at, P)
        assert swaps == (), why
        assert ev is not None and ev["spares"]["c"]["why_not"] == why, (why, ev)
    # a node that started as an active node is no spare any more (its run-start unregisters it)
    assert plan(start(("c",), st=base, policy=P), ("b",), 110.0, P) == ((), None)
    # a spare whose notes resume is offered again; a blacklist that expired no longer counts
    st, _ = note(base, "c", 150.0, checks="passed")
    assert plan(st, ("b",), 151.0, P)[0] == (("b", "c"),)
    st = replace(base, blacklist=PMap({"c": (1, 105.0)}))
    assert plan(st, ("b",), 110.0, P)[0] == (("b", "c"),)


def test_choice_is_deterministic_healthy_first_then_longest_waiting() -> None:
    st = two_and_spares("z", "y", "x")  # registered in this order (100, 101, 102)
    assert plan(st, ("b",), 110.0, P)[0] == (("b", "z"),)
    st, _ = note(st, "z", 104.0, checks="passed", registry="suspect")
    assert plan(st, ("b",), 110.0, P)[0] == (("b", "y"),)
    assert plan(st, ("a", "b"), 110.0, P)[0] == (("a", "y"), ("b", "x"))
    # all or none: three bad nodes, two usable spares -> no swap
    st3 = start(("e",), st=st, policy=P)
    st3, _ = note(st3, "z", 105.0, checks="failed")
    assert plan(st3, ("a", "b", "e"), 110.0, P)[0] == ()


def test_a_taken_spare_is_never_offered_twice() -> None:
    st = two_and_spares("c")
    st, [d] = xid_on(st, "b", 110.0, ("a",))
    assert d.swaps == (("b", "c"),)
    st, _ = note(st, "c", 112.0, checks="passed")  # its last note before it read the decision
    assert st.spares["c"].state == "taken"
    assert plan(st, ("a",), 113.0, P)[0] == ()


def test_the_rendezvous_host_is_not_swapped() -> None:
    st = two_and_spares("c")
    st, _ = note(st, "b", 100.5, role="active", rdzv_host=True)
    assert st.rdzv_hosts == {"b"} and "b" not in st.spares
    st, [d] = xid_on(st, "b", 110.0, ("a",))
    assert d.swaps == () and "rendezvous" in d.evidence["spares"]["why"]
    st2 = two_and_spares("c")
    st2, _ = note(st2, "a", 100.5, role="active", rdzv_host=True)
    st2, [d2] = xid_on(st2, "b", 110.0, ("a",))  # positive control: a hosts it, b is out
    assert d2.swaps == (("b", "c"),)


def test_no_swap_when_the_budget_fails_the_job() -> None:
    p = Policy(settle_s=1, max_restarts=0)
    st = start(("a", "b"), policy=p)
    st, _ = note(st, "c", 100.0, policy=p, checks="passed")
    st, [d] = xid_on(st, "b", 110.0, ("a",), policy=p)
    assert d.action == "fail" and d.swaps == ()
    assert "swapped" not in d.message and d.evidence["spares"]["swapped"] is False
    assert d.evidence["spares"]["why"] == "the decision is fail: no spare is swapped in"
    assert st.spares["c"].state == "waiting"


def test_a_lost_active_node_is_replaced_by_a_spare() -> None:
    st = two_and_spares("c")
    for t in (105.0, 120.0, 131.0):
        st, _ = note(st, "c", t, checks="passed")
        st, _ = apply(st, Heartbeat("j", 0, "a", t, True, t), t, P)
    st, decs = tick(st, 132.0, P, live_clock=True)  # b silent since 100
    [d] = decs
    assert (d.kind, d.action, d.swaps) == ("node-lost", "restart", (("b", "c"),))
    assert d.nodes == ("a", "c")  # b is not told to restart: its agent leaves if it returns


def test_a_waiting_spare_that_dies_is_a_notice_not_a_restart() -> None:
    st = two_and_spares("c")
    for t in (110.0, 125.0):  # the active nodes stay alive; c goes silent after 100
        for n in ("a", "b"):
            st, _ = apply(st, Heartbeat("j", 0, n, t, True, t), t, P)
    assert tick(st, 125.0, P, live_clock=True)[1] == []  # within the window
    assert tick(st, 135.0, P, live_clock=False)[1] == []  # an untrusted clock decides nothing
    st, decs = tick(st, 135.0, P, live_clock=True)
    [d] = decs
    assert (d.kind, d.action, d.nodes) == ("node-lost", "notify", ("c",))
    assert d.evidence["spare"] is True and d.evidence["blacklist_candidate"] is True
    assert st.phase != DECIDED and st.spares["c"].state == "lost"
    assert tick(st, 136.0, P, live_clock=True)[1] == []  # once
    # an active node lost at the same time: a restart (positive control of the same tick)
    st, decs = tick(st, 200.0, P, live_clock=True)
    assert [(d.kind, d.action) for d in decs] == [("node-lost", "restart")]


def test_failed_checks_are_reported_once_and_leaving_unregisters() -> None:
    st = start(("a", "b"), policy=P)
    st, decs = note(st, "c", 100.0, checks="failed", failed=["gpus"])
    [d] = decs
    assert (d.action, d.kind, d.nodes) == ("notify", "bootcheck", ("c",))
    assert d.evidence["blacklist_candidate"] is True and "never swapped in" in d.message
    st, decs = note(st, "c", 103.0, checks="failed", failed=["gpus"])
    assert decs == []
    st, _ = note(st, "c", 104.0, state="leaving")
    assert "c" not in st.spares


def test_spare_notes_count_whatever_attempt_they_name() -> None:
    st = start(("a", "b"), attempt=3, policy=P)  # the run is at attempt 3, the spare says 0
    st, _ = note(st, "c", 100.0, checks="passed")
    assert st.spares["c"].checks == "passed"
    assert new_attempt(st, 4).spares == st.spares  # run-scoped: kept across attempts


def test_a_spare_declining_its_swap_is_told() -> None:
    st = two_and_spares("c")
    st, _ = xid_on(st, "b", 110.0, ("a",))
    st, decs = note(st, "c", 113.0, state="declined", busy="job other")
    [d] = decs
    assert (d.action, d.nodes) == ("notify", ("c",)) and "declined to replace b" in d.message
    assert st.spares["c"].state == "declined"


def test_an_older_note_does_not_undo_a_newer_one() -> None:
    st = two_and_spares("c")
    st, _ = note(st, "c", 105.0, checks="failed")
    st, _ = note(st, "c", 104.0, checks="passed")
    assert st.spares["c"].checks == "failed"


def test_an_active_node_is_no_spare_and_a_spares_own_checks_blame_no_job() -> None:
    st = two_and_spares()
    st, decs = note(st, "a", 101.0, checks="passed")  # a node of the attempt says spare
    assert decs == [] and "a" not in st.spares
    # a waiting spare's check note (when: spare) of the job's attempt: no notify, no boot
    # flag (which would make it a blacklist candidate of the job): the spare note says it
    failed = {"ok": False, "when": "spare", "checks": [{"name": "disk", "ok": False}]}
    st2, decs = apply(st, Notice("j", 0, "c", 102.0, "bootcheck", failed), 102.0, P)
    assert decs == [] and "boot:c" not in st2.flags
    _, decs = apply(st, Notice("j", 0, "a", 102.0, "bootcheck", {**failed, "when": "start"}),
                    102.0, P)
    assert [d.kind for d in decs] == ["bootcheck"]  # positive control: an active node's


def test_an_operators_hold_turns_a_swap_into_a_notice_and_takes_no_spare() -> None:
    from faultwatch.core.holds import HOLD, hold_decisions, new_hold
    from faultwatch.wire import decision_of, decision_to_dict

    prev = two_and_spares("c")
    st, [d] = xid_on(prev, "b", 110.0, ("a",))
    assert d.swaps and st.spares["c"].state == "taken"  # without the hold
    hold = new_hold(HOLD, "j", 100.0, 3600.0, "maintenance", "op@host", "h1")
    st2, [n] = hold_decisions(prev, st, [d], hold, 112.0)
    assert (n.action, n.swaps) == ("notify", ())
    assert n.evidence["held"]["swaps"] == [{"node": "b", "spare": "c"}]
    assert st2.spares["c"].state == "waiting"  # offered again once the hold ends
    assert decision_of(decision_to_dict(n)) == n  # a notice consumers can decode
