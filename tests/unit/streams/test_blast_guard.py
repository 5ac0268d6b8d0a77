"""The blast-radius guard through the job stage (embedded mode's LocalPipeline, processor
time passed in): a lone lost node is decided at once; many jobs going silent together are
held with one notice, released when they report again, and decided at a bounded rate when
the hold runs out."""

from __future__ import annotations

from faultwatch import wire
from faultwatch.core.blast import NOTICE_KIND
from faultwatch.core.events import Decision, Heartbeat, RunStart
from faultwatch.core.policy import Policy
from faultwatch.errors import ConfigError
from faultwatch.streams.local import LocalPipeline
from tests.support.rules import builtin_ruleset

T0 = 1_700_000_000.0


def fleet(n: int, policy: Policy, node: str | None = None) -> tuple[LocalPipeline, list[str]]:
    """`n` jobs, each on its own node (`n-<job>`), or all on `node`."""
    pipe = LocalPipeline(builtin_ruleset(), policy)
    jobs = [f"j{i}" for i in range(n)]
    for j in jobs:
        on = node or f"n-{j}"
        pipe.submit(wire.log_key(j, on), wire.encode_run_start(RunStart(j, 0, on, T0)), T0)
    return pipe, jobs


def beat(pipe: LocalPipeline, jobs: list[str], now: float, node: str | None = None
         ) -> list[Decision]:
    out: list[Decision] = []
    for j in jobs:
        on = node or f"n-{j}"
        out += pipe.submit(wire.log_key(j, on), wire.encode_heartbeat(
            Heartbeat(j, 0, on, now, True, now, T0)), now)
    return out


def run(pipe: LocalPipeline, live: list[str], t0: float, t1: float) -> list[Decision]:
    """Heartbeats from `live` and ticks, every half second of processor time."""
    out: list[Decision] = []
    t = t0
    while t < t1:
        out += beat(pipe, live, t) + pipe.tick(t)
        t += 0.5
    return out


def kinds(decs: list[Decision]) -> list[tuple[str, str]]:
    return [(d.job, d.kind) for d in decs if d.kind != "diagnose"]


def test_lone_loss_acted_on_fleet_silence_held_then_released_on_return() -> None:
    policy = Policy(node_lost_s=5.0, hang_window_s=600.0)
    pipe, jobs = fleet(17, policy)
    lone, many = jobs[0], jobs[1:]
    decs = run(pipe, jobs, T0, T0 + 20)
    assert kinds(decs) == []
    # positive control: one job of 17 goes silent -> node-lost at once
    decs = run(pipe, many, T0 + 20, T0 + 30)
    assert kinds(decs) == [(lone, "node-lost")]
    # the 16 others go silent together: one notice, no action
    decs = run(pipe, [], T0 + 30, T0 + 60)
    assert kinds(decs) == [("(fleet)", NOTICE_KIND)], kinds(decs)
    notice = decs[-1]
    assert notice.action == "notify" and notice.evidence["held_now"] == 16
    assert notice.evidence["jobs"] == 17 and notice.evidence["of_jobs"] == 17  # lone too
    assert pipe.jobs.guard.holding and len(pipe.jobs.guard.held) == 16
    assert pipe.metrics.storm.holding and pipe.metrics.storm.held == 16
    # they come back (a gap in their heartbeats' event time): released, never acted on
    decs = run(pipe, many, T0 + 62, T0 + 64)
    assert kinds(decs) == []
    assert not pipe.jobs.guard.holding and not pipe.jobs.guard.held
    assert pipe.metrics.storm.holding is False
    # and after the episode a lone loss is decided again (even one right after the return)
    decs = run(pipe, many[1:], T0 + 64, T0 + 110)
    assert kinds(decs) == [(many[0], "node-lost")]


def test_hold_runs_out_then_jobs_are_decided_at_a_bounded_rate() -> None:
    policy = Policy(node_lost_s=5.0, hang_window_s=600.0, fleet_storm_hold_max_s=30.0,
                    fleet_storm_release_per_min=6.0)
    pipe, jobs = fleet(10, policy)
    run(pipe, jobs, T0, T0 + 20)
    decs = run(pipe, [], T0 + 20, T0 + 54)  # held (tripped ~T0+25), hold not yet over
    assert kinds(decs) == [("(fleet)", NOTICE_KIND)]
    decs = run(pipe, [], T0 + 54, T0 + 54 + 60)  # released at 6 a minute
    lost = [d for d in decs if d.kind == "node-lost"]
    assert 4 <= len(lost) <= 7, kinds(decs)
    assert not [d for d in decs if d.kind == NOTICE_KIND]  # no second notice
    decs = run(pipe, [], T0 + 114, T0 + 114 + 60)
    assert len([d for d in decs if d.kind == "node-lost"]) + len(lost) == 10


def test_a_fleet_hang_is_held_too() -> None:
    """Jobs whose output stops together (storage stall) while heartbeats go on: each asks
    for a diagnosis at half its window (a suspected hang), so the first hang decision finds
    them all suspect and trips the guard; their output resumes: released, no action."""
    policy = Policy(node_lost_s=5.0, hang_window_s=10.0)
    pipe, jobs = fleet(8, policy)
    out: list[Decision] = []
    t = T0
    while t < T0 + 40:
        for j in jobs:  # heartbeats say: last output at T0+5
            out += pipe.submit(wire.log_key(j, f"n-{j}"), wire.encode_heartbeat(
                Heartbeat(j, 0, f"n-{j}", t, True, min(t, T0 + 5), T0)), t)
        out += pipe.tick(t)
        t += 0.5
    assert kinds(out) == [("(fleet)", NOTICE_KIND)], kinds(out)
    assert len(pipe.jobs.guard.held) == 8
    out = run(pipe, jobs, T0 + 40, T0 + 60)  # output again (run() beats with output)
    assert kinds(out) == [] and not pipe.jobs.guard.holding


def test_off_switch_and_policy_bounds() -> None:
    policy = Policy(node_lost_s=5.0, hang_window_s=600.0, fleet_storm_detection=False)
    pipe, jobs = fleet(6, policy)
    run(pipe, jobs, T0, T0 + 20)
    decs = run(pipe, [], T0 + 20, T0 + 40)
    assert sorted(kinds(decs)) == sorted((j, "node-lost") for j in jobs)
    for bad in ({"fleet_storm_share": 0}, {"fleet_storm_share": 1.5},
                {"fleet_storm_min_jobs": 1}, {"fleet_storm_window_s": 0},
                {"fleet_storm_hold_max_s": 1.0}, {"fleet_storm_release_per_min": 0}):
        try:
            Policy().with_overrides(bad)
        except ConfigError:
            continue
        raise AssertionError(f"accepted {bad}")


def test_jobs_one_node_claims_count_as_one_node() -> None:
    """Issue 35 item 3: 40 phantom jobs of one node and a real job going silent are two
    node identities of many, not 41 of 58 jobs: the guard does not trip, and the real job's
    lost node is decided at once (before: held up to fleet_storm_hold_max_s, 600 s).
    Positive control: the same 41 jobs each on a node of its own trip it."""
    from faultwatch.streams.job_stage import DictStore, JobStage
    from faultwatch.streams.records import InRecord, LiveRules

    def decided(phantom_node: str | None) -> tuple[bool, list[tuple[str, str]]]:
        live = LiveRules(None, Policy(node_lost_s=5.0, hang_window_s=600.0), "v")  # type: ignore[arg-type]
        stage = JobStage(live, DictStore(), lambda rec, err: None)
        jobs = {**{f"p{i}": phantom_node or f"n-p{i}" for i in range(40)}, "real": "n-real",
                **{f"h{i}": f"n-h{i}" for i in range(17)}}

        def rec(job: str, sig: object) -> InRecord:
            return InRecord("t", 0, 0, wire.job_key(job), wire.encode_bundle(job, [sig]))  # type: ignore[list-item]

        stage.process_batch([rec(j, RunStart(j, 0, n, T0, run_id=j)) for j, n in jobs.items()],
                            T0)
        out: list[Decision] = []
        t = T0
        while t < T0 + 20:  # only the 17 healthy jobs report
            out += stage.process_batch([rec(j, Heartbeat(j, 0, jobs[j], t, True, t, T0,
                                                          run_id=j))
                                        for j in jobs if j.startswith("h")], t)
            out += stage.tick(0, t, t)
            t += 0.5
        return stage.guard.holding, kinds(out)

    holding, decs = decided("nodeA")
    assert not holding and ("real", "node-lost") in decs
    assert NOTICE_KIND not in {k for _, k in decs}
    holding, decs = decided(None)  # positive control: 41 nodes of 58 went silent
    assert holding and ("(fleet)", NOTICE_KIND) in decs and ("real", "node-lost") not in decs
