"""What the stages spend per batch and tick (issue 14): heartbeats of a lagging node fold
into one, a job is written once per batch, a tick calls the core only for jobs with work
(settling, or a live node silent for the node-lost window); decisions stay the same."""

from __future__ import annotations

import functools
from typing import Any

import orjson
import pytest

from faultwatch import wire
from faultwatch.core.events import Decision, Heartbeat, Line, RunStart, Stage
from faultwatch.core.policy import Policy
from faultwatch.rules import Matcher
from faultwatch.streams import job_stage as job_stage_mod
from faultwatch.streams import job_states as job_states_mod
from faultwatch.streams.job_stage import WRITE_BEHIND_S, DictStore, JobStage
from faultwatch.streams.matcher_stage import MatcherStage
from faultwatch.streams.records import InRecord, LiveRules
from tests.support.rules import builtin_ruleset

T0 = 1_700_000_000.0
POLICY = Policy(settle_s=0.5, node_lost_s=5.0)


@functools.cache
def ruleset() -> Any:
    return builtin_ruleset()


def live() -> LiveRules:
    rs = ruleset()
    return LiveRules(Matcher(rs), POLICY, rs.version)


def dead(rec: InRecord, err: Exception) -> None:
    raise AssertionError(f"dead letter at offset {rec.offset}: {err}")


def hb(job: str, node: str, ts: float, last_output_ts: float | None = None) -> bytes:
    last = ts - 1 if last_output_ts is None else last_output_ts
    return wire.encode_heartbeat(Heartbeat(job, 0, node, ts, True, last, T0), "r", {})


def logs(values: list[bytes]) -> list[InRecord]:
    return [InRecord("t.logs", 0, i, b"k", v) for i, v in enumerate(values)]


def heartbeats_out(out: list[tuple[bytes, bytes]]) -> list[tuple[str, str, float]]:
    sigs = [s for _, v in out for s in wire.signals_of_record(wire.decode(v))]
    return [(s.job, s.node, s.ts) for s in sigs if isinstance(s, Heartbeat)]


# ---- matcher stage: heartbeats fold ---------------------------------------------------------

def test_a_nodes_heartbeats_in_a_run_fold_into_its_latest() -> None:
    stage = MatcherStage(live(), dead)
    out = stage.process_batch(logs([hb("a", "n0", T0 + 1), hb("a", "n1", T0 + 1.5),
                                    hb("b", "n0", T0 + 1.7), hb("a", "n0", T0 + 3),
                                    hb("a", "n0", T0 + 5)]), T0 + 6)
    assert heartbeats_out(out) == [("a", "n1", T0 + 1.5), ("a", "n0", T0 + 5),
                                   ("b", "n0", T0 + 1.7)]
    assert stage.metrics.extra["heartbeats_folded"] == 2


def test_a_line_between_two_heartbeats_keeps_both() -> None:
    stage = MatcherStage(live(), dead)
    line = wire.encode_lines("a", 0, "n0", "r", [Line("stdout", 0, T0 + 2, "step 1")])
    out = stage.process_batch(logs([hb("a", "n0", T0 + 1), line, hb("a", "n0", T0 + 3)]),
                              T0 + 4)
    assert heartbeats_out(out) == [("a", "n0", T0 + 1), ("a", "n0", T0 + 3)]
    assert "heartbeats_folded" not in stage.metrics.extra


def test_a_heartbeat_that_says_less_does_not_replace_an_earlier_one() -> None:
    """A resent (older) heartbeat after a newer one, or one with an older last output: both
    stay (the state keeps the newest output time from either)."""
    stage = MatcherStage(live(), dead)
    out = stage.process_batch(logs([hb("a", "n0", T0 + 5), hb("a", "n0", T0 + 3),
                                    hb("a", "n1", T0 + 5, T0 + 4), hb("a", "n1", T0 + 6, T0 + 2)]),
                              T0 + 7)
    assert heartbeats_out(out) == [("a", "n0", T0 + 5), ("a", "n0", T0 + 3),
                                   ("a", "n1", T0 + 5), ("a", "n1", T0 + 6)]
    assert "heartbeats_folded" not in stage.metrics.extra


def test_folded_heartbeats_decide_the_same_hang() -> None:
    """A hung job read from a backlog: every heartbeat one by one, or folded, gives the same
    decision (its id; folded, it is made at the run's last heartbeat) and the same nodes."""
    pol = Policy(hang_window_s=10.0, settle_s=0.5, node_lost_s=60.0, diagnose=False)
    rs = ruleset()
    start = [wire.encode_run_start(RunStart("h", 0, n, T0, run_id="r", nnodes=2))
             for n in ("n0", "n1")]
    beats = [hb("h", n, T0 + 2 * k + (0.5 if n == "n1" else 0), T0 + 1) for k in range(1, 10)
             for n in ("n0", "n1")]
    results = []
    for batch in (1, len(start) + len(beats)):  # a record per batch (no fold), one batch
        lr = LiveRules(Matcher(rs), pol, rs.version)
        ms, js = MatcherStage(lr, dead), JobStage(lr, DictStore(), dead)
        decs: list[Decision] = []
        recs = start + beats
        for i in range(0, len(recs), batch):
            sigs = ms.process_batch(logs(recs[i:i + batch]), T0 + 30)
            decs += js.process_batch([InRecord("t.signals", 0, k, key, v)
                                      for k, (key, v) in enumerate(sigs)], T0 + 30)
        results.append(([(d.id, d.kind) for d in decs],
                        js.parts[0].cache[b"h"].to_dict()["nodes"],
                        ms.metrics.extra.get("heartbeats_folded", 0)))
    (one_by_one, st1, folded1), (batched, st2, folded2) = results
    assert [k for _, k in one_by_one] == ["hang"] and one_by_one == batched
    assert st1 == st2
    assert folded1 == 0 and folded2 == len(beats) - 2


# ---- job stage: writes once per batch, ticks what is due ------------------------------------

class CountingStore(DictStore):
    def __init__(self) -> None:
        super().__init__()
        self.puts: list[bytes] = []

    def put(self, partition: int, key: bytes, value: bytes) -> None:
        self.puts.append(key)
        super().put(partition, key, value)


def signals(job: str, sigs: list[Any], offset: int = 0) -> InRecord:
    return InRecord("t.signals", 0, offset, job.encode(), wire.encode_bundle(job, sigs))


def tick_rec(now: float) -> InRecord:
    return InRecord("t.signals", 0, 0, None, orjson.dumps({"v": 1, "t": "tick", "now": now}))


def test_a_job_is_written_once_per_batch_and_before_it_returns() -> None:
    store = CountingStore()
    stage = JobStage(live(), store, dead)
    recs = [signals("j", [RunStart("j", 0, "n0", T0, run_id="r")], 0)]
    recs += [signals("j", [Stage("j", 0, "n0", T0 + k, 0, f"s{k}", True, 60.0, run_id="r")], k)
             for k in range(1, 4)]  # lifecycle records: each one written through
    stage.process_batch(recs, T0 + 4)
    assert store.puts == [b"j"]
    assert orjson.loads(store.data[b"j"])["stages"][0][1] == "s3"  # the batch's last state
    # positive control: outside a batch (fold called directly) each record is written
    stage.fold(0, [Stage("j", 0, "n0", T0 + 5, 0, "s4", True, 60.0, run_id="r")], T0 + 5)
    assert store.puts == [b"j", b"j"]


def test_liveness_is_written_behind_by_the_tick_once_due() -> None:
    store = CountingStore()
    stage = JobStage(live(), store, dead)
    stage.process_batch([signals("j", [RunStart("j", 0, "n0", T0, run_id="r")])], T0)
    stage.process_batch([signals("j", [Heartbeat("j", 0, "n0", T0 + 1, True, T0 + 1, T0,
                                                 run_id="r")])], T0 + 1)
    stage.process_batch([tick_rec(T0 + 2)], T0 + 2)
    assert store.puts == [b"j"] and stage.dirty == 1  # written at T0: not due before T0 + 5
    stage.process_batch([tick_rec(T0 + WRITE_BEHIND_S + 0.1)], T0 + WRITE_BEHIND_S + 0.1)
    assert store.puts == [b"j", b"j"] and stage.dirty == 0


def test_liveness_writes_wait_longer_when_a_worker_holds_many_jobs(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """20 active jobs at 2 liveness writes a second: each job's write-behind is 10 s."""
    monkeypatch.setattr(job_states_mod, "LIVENESS_WRITES_MAX_PER_S", 2.0)
    store = CountingStore()
    stage = JobStage(live(), store, dead)
    jobs = [f"j{i}" for i in range(20)]
    stage.process_batch([signals(j, [RunStart(j, 0, "n0", T0, run_id="r")]) for j in jobs], T0)
    assert stage.write_behind_s() == 10.0 and len(store.puts) == 20
    stage.process_batch([signals(j, [Heartbeat(j, 0, "n0", T0 + 1, True, T0 + 1, T0,
                                               run_id="r")]) for j in jobs], T0 + 1)
    for k in range(2, 20):
        stage.process_batch([tick_rec(T0 + k / 2)], T0 + k / 2)
    stage.process_batch([tick_rec(T0 + WRITE_BEHIND_S + 1)], T0 + WRITE_BEHIND_S + 1)
    assert len(store.puts) == 20 and stage.dirty == 20  # not at 5 s
    stage.process_batch([tick_rec(T0 + 10.1)], T0 + 10.1)
    assert len(store.puts) == 40 and stage.dirty == 0  # at 10 s


def test_a_tick_calls_the_core_only_for_jobs_with_work(monkeypatch: pytest.MonkeyPatch) -> None:
    """50 jobs whose node heart-beats every second and one whose node went silent: over 40 s
    of ticks only the silent one reaches the core's tick, and it is decided lost."""
    stage = JobStage(live(), DictStore(), dead)
    jobs = [f"j{i}" for i in range(50)] + ["quiet"]
    stage.process_batch([signals(j, [RunStart(j, 0, "n0", T0, run_id="r")]) for j in jobs], T0)
    real = job_stage_mod.tick
    calls: list[str] = []

    def tick(st: Any, *a: Any, **kw: Any) -> Any:
        calls.append(st.job)
        return real(st, *a, **kw)

    monkeypatch.setattr(job_stage_mod, "tick", tick)
    decs: list[Decision] = []
    for k in range(1, 80):
        now = T0 + k / 2
        if k % 2 == 0:
            decs += stage.process_batch([signals(j, [Heartbeat(j, 0, "n0", now, True, now, T0,
                                                               run_id="r")])
                                         for j in jobs[:-1]], now)
        decs += stage.process_batch([tick_rec(now)], now)
    assert [(d.job, d.kind) for d in decs] == [("quiet", "node-lost")]
    assert set(calls) == {"quiet"} and len(calls) == 1
