"""Issue 35 item 4: a decision's time is the time of its evidence, and a processor publishes
no decision about evidence older than the decision age limit: a new consumer group reading
the logs topic from its start, or a node's own old records sent again, re-decide history
that no one may act on (before: 28 old decisions went out again with a fresh `ts`)."""

from __future__ import annotations

from faultwatch import wire
from faultwatch.core.events import Decision, Exit, Heartbeat, Hit, Match, RunStart, Signal
from faultwatch.core.job import apply, new_state, tick
from faultwatch.core.policy import Policy
from faultwatch.streams.job_stage import DictStore, JobStage
from faultwatch.streams.records import InRecord, LiveRules

T0 = 1_700_000_000.0
P = Policy(settle_s=1.0, node_lost_s=30.0)
XID = Match("nvidia-xid-hardware", "hardware", False, T0 + 1, "NVRM: Xid 79", None)


def history(job: str, t: float) -> list[Signal]:
    """What a node shipped for a job that hit an Xid and exited, at event time `t`."""
    m = Match(XID.rule, XID.category, False, t + 1, XID.line, None)
    return [RunStart(job, 0, "n0", t, run_id="r"), Hit(job, 0, "n0", m, run_id="r"),
            Exit(job, 0, "n0", t + 1.5, 1, run_id="r")]


def test_a_failure_decided_late_carries_the_time_of_its_evidence() -> None:
    sigs = history("j", T0)
    st = new_state(sigs[0])
    assert st is not None
    decs: list[Decision] = []
    for s in sigs:
        st, d = apply(st, s, T0 + 3600, P)  # read an hour later
        decs += d
    assert [(d.action, d.ts) for d in decs] == [("blacklist", T0 + 1.5)]


def test_a_lost_node_is_stamped_when_its_silence_became_a_loss() -> None:
    st = new_state(RunStart("j", 0, "n0", T0, run_id="r"))
    assert st is not None
    st, _ = apply(st, RunStart("j", 0, "n0", T0, run_id="r"), T0, P)
    st, _ = apply(st, Heartbeat("j", 0, "n0", T0 + 5, True, T0 + 5, T0, run_id="r"), T0 + 5, P)
    _, decs = tick(st, T0 + 5 + P.node_lost_s + 2, P, live_clock=True)
    assert [(d.kind, d.ts) for d in decs] == [("node-lost", T0 + 5 + P.node_lost_s)]


def test_the_job_stage_withholds_decisions_about_old_evidence() -> None:
    """History read anew: the decision is made (the job's state moves on) but not
    published, counted and logged; the same failure read in time is published."""
    live = LiveRules(None, P, "v")  # type: ignore[arg-type]
    stage = JobStage(live, DictStore(), lambda rec, err: None, max_decision_age_s=600.0)

    def records(job: str, t: float) -> list[InRecord]:
        return [InRecord("t.signals", 0, i, wire.job_key(job), wire.encode_bundle(job, [s]))
                for i, s in enumerate(history(job, t))]

    now = T0 + 3600
    assert stage.process_batch(records("old", T0), now) == []
    assert stage.metrics.extra["decisions_withheld"] == 1
    st = stage.load(wire.job_key("old"), stage.parts[0])
    assert st is not None and st.decided  # decided once: not re-made on every record
    # the same records sent again (a node replaying its own signed records) decide nothing
    assert stage.process_batch(records("old", T0), now + 1) == []
    assert stage.metrics.extra["decisions_withheld"] == 1
    # positive control: a failure of now
    fresh = stage.process_batch(records("new", now - 2), now)
    assert [(d.job, d.action) for d in fresh] == [("new", "blacklist")]
