"""Which status snapshots a processor publishes (issue 14): what changed at once, a last one
when a job is decided, and unchanged jobs refreshed oldest first at a bounded rate."""

from __future__ import annotations

import functools
from typing import Any

import orjson

from faultwatch import wire
from faultwatch.core.events import Exit, Heartbeat, Output, RunStart, Stage
from faultwatch.core.policy import Policy
from faultwatch.rules import Matcher, load_ruleset
from faultwatch.streams.job_stage import DictStore, JobStage
from faultwatch.streams.records import InRecord, LiveRules
from faultwatch.streams.status_publish import StatusPublisher

T0 = 1_700_000_000.0
POLICY = Policy(settle_s=0.5, node_lost_s=600.0)


@functools.cache
def ruleset() -> Any:
    return load_ruleset(())


def stage() -> JobStage:
    rs = ruleset()

    def dead(rec: InRecord, err: Exception) -> None:
        raise AssertionError(f"dead letter at offset {rec.offset}: {err}")

    return JobStage(LiveRules(Matcher(rs), POLICY, rs.version), DictStore(), dead)


def feed(js: JobStage, now: float, *sigs: Any) -> None:
    recs = [InRecord("t.signals", 0, k, s.job.encode(), wire.encode_bundle(s.job, [s]))
            for k, s in enumerate(sigs)]
    recs.append(InRecord("t.signals", 0, 0, None, wire.encode_tick(now)))
    js.process_batch(recs, now)


def start(js: JobStage, jobs: list[str], nodes: int = 1) -> None:
    feed(js, T0, *[RunStart(j, 0, f"n{k}", T0, run_id="r", nnodes=nodes, rank=k)
                   for j in jobs for k in range(nodes)])


def beats(js: JobStage, jobs: list[str], now: float) -> None:
    feed(js, now, *[Heartbeat(j, 0, "n0", now, True, now, T0, run_id="r") for j in jobs])


def published(pub: StatusPublisher, js: JobStage, now: float) -> list[dict[str, Any]]:
    out = pub.due(list(js.parts.values()), now, POLICY)
    snaps = [wire.decode_status(v) for _, v in out]
    assert [k for k, _ in out] == [s["job"].encode() for s in snaps]
    return snaps


def test_unchanged_jobs_are_refreshed_oldest_first_at_a_bounded_rate() -> None:
    js, pub = stage(), StatusPublisher(status_s=3.0, max_per_s=1.0)  # 3 a call
    jobs = [f"j{i}" for i in range(10)]
    start(js, jobs)
    assert sorted(s["job"] for s in published(pub, js, T0)) == jobs  # new: all at once
    assert pub.refresh_s(10) == 10.0
    refreshed: list[str] = []
    for k in range(1, 5):
        now = T0 + 3.0 * k
        beats(js, jobs, now - 1)  # liveness changes the states, not what a reader acts on
        snaps = published(pub, js, now)
        assert len(snaps) == 3
        assert {s["ts"] for s in snaps} == {now}
        refreshed += [s["job"] for s in snaps]
    assert sorted(refreshed[:10]) == jobs  # each one within ceil(10 / 3) calls, none twice
    assert refreshed[10:] == refreshed[:2]  # then again from the oldest
    # a refreshed snapshot carries the ages of its time
    assert {s["nodes"][0]["last_heartbeat_age_s"] for s in snaps} == {1.0}


def test_nothing_is_refreshed_twice_within_the_status_interval() -> None:
    js, pub = stage(), StatusPublisher(status_s=3.0, max_per_s=100.0)
    start(js, ["a", "b"])
    assert len(published(pub, js, T0)) == 2
    beats(js, ["a", "b"], T0 + 1)
    assert published(pub, js, T0 + 2.9) == []
    assert len(published(pub, js, T0 + 3.0)) == 2  # positive control: due at 3 s


def test_a_material_change_is_published_at_once_without_the_refresh_budget() -> None:
    js, pub = stage(), StatusPublisher(status_s=3.0, max_per_s=0.1)  # no refresh at all
    start(js, ["a", "b"], nodes=2)
    assert len(published(pub, js, T0)) == 2
    beats(js, ["a", "b"], T0 + 1)
    assert published(pub, js, T0 + 3) == []  # liveness only
    feed(js, T0 + 4, Stage("a", 0, "n0", T0 + 4, 0, "checkpoint", True, 60.0, run_id="r"))
    feed(js, T0 + 5, Output("a", 0, "n0", T0 + 5, 2, rank_last_ts=((0, T0 + 5), (1, T0 + 5)),
                            run_id="r"))
    assert published(pub, js, T0 + 6) == []  # a stage and new ranks: by the refresh only
    feed(js, T0 + 7, Exit("b", 0, "n1", T0 + 7, exit_code=0, run_id="r"))
    [snap] = published(pub, js, T0 + 9)
    assert (snap["job"], snap["nodes_alive"]) == ("b", 1)
    assert published(pub, js, T0 + 12) == []
    feed(js, T0 + 13, Exit("a", 0, "n1", T0 + 13, exit_code=0, run_id="r"))
    [snap] = published(pub, js, T0 + 15)
    assert (snap["job"], snap["nodes_alive"], snap["stages"]) == ("a", 1, ["checkpoint"])
    assert snap["ranks_total"] == 2


def test_a_decided_job_gets_a_last_snapshot_then_is_forgotten() -> None:
    js, pub = stage(), StatusPublisher(status_s=3.0, max_per_s=100.0)
    start(js, ["a", "b"])
    assert len(published(pub, js, T0)) == 2
    feed(js, T0 + 1, Exit("a", 0, "n0", T0 + 1, exit_code=1, run_id="r"))
    feed(js, T0 + 2)  # settle_s passed: decided
    assert js.parts[0].cache[b"a"].phase == "decided"
    snaps = {s["job"]: s for s in published(pub, js, T0 + 3)}
    assert snaps["a"]["phase"] == "decided" and snaps["a"]["nodes_alive"] == 0
    assert snaps["b"]["phase"] == "running"  # positive control: the other one refreshed
    assert [s["job"] for s in published(pub, js, T0 + 6)] == ["b"]
    assert b"a" not in pub.seen


def test_jobs_of_revoked_partitions_are_dropped_without_a_snapshot() -> None:
    js, pub = stage(), StatusPublisher(status_s=3.0, max_per_s=100.0)
    start(js, ["a"])
    assert len(published(pub, js, T0)) == 1
    js.on_revoked([0], T0 + 1)
    assert published(pub, js, T0 + 3) == [] and pub.seen == {}
    assert orjson.loads(js.store.get(b"a") or b"{}")["phase"] == "running"  # kept in store


def test_a_job_that_ends_between_two_looks_still_gets_its_snapshot() -> None:
    """Issue 36: a job that crashes at start or succeeds at once was never published while
    running; its final snapshot is published all the same (once)."""
    js, pub = stage(), StatusPublisher(status_s=3.0, max_per_s=100.0)
    start(js, ["running"])
    assert [s["job"] for s in published(pub, js, T0)] == ["running"]
    feed(js, T0 + 0.1, RunStart("crash", 0, "n0", T0 + 0.1, run_id="r", nnodes=1, rank=0),
         Exit("crash", 0, "n0", T0 + 0.3, exit_code=1, run_id="r"),
         RunStart("quick", 0, "n0", T0 + 0.1, run_id="r", nnodes=1, rank=0),
         Exit("quick", 0, "n0", T0 + 0.2, exit_code=0, run_id="r"))
    feed(js, T0 + 1.0)  # settle_s passed: the crash is decided
    snaps = {s["job"]: s for s in published(pub, js, T0 + 3)}
    assert (snaps["crash"]["phase"], snaps["crash"]["nodes"][0]["exit_code"]) == ("decided", 1)
    assert len(snaps["crash"]["decisions"]) == 1
    assert (snaps["quick"]["phase"], snaps["quick"]["nodes"][0]["exit_code"]) == ("done", 0)
    assert snaps["running"]["phase"] == "running"  # positive control: refreshed as before
    assert [s["job"] for s in published(pub, js, T0 + 6)] == ["running"]  # once each
