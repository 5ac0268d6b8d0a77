"""Issue 35 item 3: one node's key cannot fill the job table. New jobs and run-starts are
limited per node a minute (core/quota.py); a full table makes room by forgetting the job
that has shown nothing but a run-start for longest before it refuses a real one, also after
a processor restart (streams/job_table.py)."""

from __future__ import annotations

from faultwatch import wire
from faultwatch.core.events import Decision, Exit, Heartbeat, Hit, Match, RunStart, Signal
from faultwatch.core.policy import Policy
from faultwatch.core.quota import HORIZON_S, NEW_JOBS, RUN_STARTS, NodeQuota
from faultwatch.registry.gate import NodeGate
from faultwatch.streams.job_stage import DictStore, JobStage
from faultwatch.streams.records import InRecord, LiveRules
from faultwatch.trust.refusals import REFUSALS

T0 = 1_700_000_000.0
XID = Match("nvidia-xid-hardware", "hardware", False, T0 + 1, "NVRM: Xid 79", None)


def stage(max_jobs: int = 20_000, store: DictStore | None = None,
          quota: NodeQuota | None = None) -> JobStage:
    live = LiveRules(None, Policy(settle_s=1.0), "v")  # type: ignore[arg-type]
    st = JobStage(live, store or DictStore(), lambda rec, err: None, max_jobs=max_jobs)
    st.quota = quota
    st.gate = NodeGate(quota=quota, refused=st.refused_start)
    return st


def rec(job: str, *sigs: Signal, partition: int = 0) -> InRecord:
    return InRecord("t.signals", partition, 0, wire.job_key(job),
                    wire.encode_bundle(job, list(sigs)))


def phantom(job: str, node: str = "nodeA", ts: float = T0, partition: int = 0) -> InRecord:
    return rec(job, RunStart(job, 0, node, ts, run_id=job), partition=partition)


def real_job_fails(s: JobStage, job: str, now: float) -> list[Decision]:
    """A real job on nodeR: run-start, heartbeat, an Xid line, its exit."""
    out = s.process_batch([rec(job, RunStart(job, 0, "nodeR", now, run_id=job),
                               Heartbeat(job, 0, "nodeR", now, True, now, now, run_id=job))],
                          now)
    m = Match(XID.rule, XID.category, False, now + 1, XID.line, None)
    out += s.process_batch([rec(job, Hit(job, 0, "nodeR", m, run_id=job),
                                Exit(job, 0, "nodeR", now + 1.5, 1, run_id=job))], now + 2)
    return out


def active(s: JobStage) -> int:
    return sum(len(p.active) for p in s.parts.values())


def test_quota_bucket() -> None:
    q = NodeQuota(new_jobs_per_min=3, run_starts_per_min=0)
    assert [q.take(NEW_JOBS, "a", T0, T0) for _ in range(4)] == [True, True, True, False]
    assert q.take(NEW_JOBS, "b", T0, T0)  # another node: its own bucket
    assert q.take(NEW_JOBS, "a", T0 + 20, T0 + 20)  # a token a 20 s
    assert not q.take(NEW_JOBS, "a", T0 + 20, T0 + 20)
    assert all(q.take(RUN_STARTS, "a", T0, T0) for _ in range(100))  # 0: no quota
    # records stamped far in the past gain at most HORIZON_S of tokens
    q2 = NodeQuota(new_jobs_per_min=1)
    took = sum(q2.take(NEW_JOBS, "a", T0 - 86_400 + i * 60, T0) for i in range(1440))
    assert took <= 1 + HORIZON_S / 60 + 1, took


def test_a_node_starts_at_most_its_quota_of_new_jobs_a_minute() -> None:
    """The issue's flood: 20,500 one-record jobs from one node in ~9 s. Here 500 in one
    batch: 60 are kept, the rest refused and counted; another node's job is kept, and the
    flooding node gets its next jobs a minute later."""
    s = stage(quota=NodeQuota())
    kinds = (("run", "quota_new_jobs"), ("run", "quota_run_starts"))
    before = [REFUSALS[k] for k in kinds]
    s.process_batch([phantom(f"ph{i}") for i in range(500)], T0)
    refused = [REFUSALS[k] - b for k, b in zip(kinds, before, strict=True)]
    # the first 120 run-starts pass the run-start quota, 60 of them the new-job quota
    assert active(s) == 60 and refused == [60, 380]
    assert [d.action for d in real_job_fails(s, "real", T0 + 1)] == ["blacklist"]
    s.process_batch([phantom(f"later{i}", ts=T0 + 61) for i in range(100)], T0 + 61)
    assert active(s) == 60 + 60  # (the real job was decided: no longer active)


def test_a_node_restarts_at_most_its_quota_of_run_starts_a_minute() -> None:
    s = stage(quota=NodeQuota(new_jobs_per_min=0, run_starts_per_min=5))
    starts = [RunStart("j", 0, "nodeA", T0 + i * 0.01, run_id=f"r{i}", run_source="flag")
              for i in range(10)]
    s.process_batch([rec("j", st) for st in starts], T0)
    state = s.load(wire.job_key("j"), s.parts[0])
    assert state is not None and state.run_id == "r4"  # the 6th run-start on was refused
    assert s.metrics.extra["dropped.quota-run_starts"] == 5


def test_a_full_table_forgets_the_oldest_phantom_before_refusing_a_real_job() -> None:
    """The cap reached by phantoms (one run-start each, nothing since): a real job takes the
    oldest one's place and its Xid is decided (before: refused, exit 77 for its agent). With
    the table full of jobs that heart-beat, a new job is refused (the cap holds)."""
    s = stage(max_jobs=50)
    s.process_batch([phantom(f"ph{i:02d}", ts=T0 + i * 0.001) for i in range(50)], T0)
    assert active(s) == 50
    decs = real_job_fails(s, "real", T0 + 5)
    assert [d.action for d in decs] == ["blacklist"] and active(s) == 49  # it was decided
    assert s.store.get(wire.job_key("ph00")) is None  # the oldest phantom went first
    assert s.store.get(wire.job_key("ph01")) is not None
    assert s.metrics.extra["jobs_evicted_cheap"] == 1
    # no phantom left to forget: a new job is refused
    full = stage(max_jobs=3)
    for i in range(3):
        full.process_batch([rec(f"busy{i}", RunStart(f"busy{i}", 0, f"n{i}", T0, run_id="r"),
                                Heartbeat(f"busy{i}", 0, f"n{i}", T0, True, T0, T0,
                                          run_id="r"))], T0)
    full.process_batch([phantom("late")], T0 + 1)
    assert active(full) == 3 and full.store.get(wire.job_key("late")) is None
    assert full.metrics.extra["jobs_refused"] == 1


def test_phantoms_are_still_forgotten_after_a_processor_restart() -> None:
    """The issue: the flood survived a restart. A new stage over the same store (a worker
    recovering its table) knows which recovered jobs showed nothing."""
    store = DictStore()
    s = stage(max_jobs=20, store=store)
    s.process_batch([phantom(f"ph{i:02d}", partition=i % 4) for i in range(20)], T0)
    again = stage(max_jobs=20, store=store)
    for p in range(4):
        again.tick(p, T0 + 100, T0 + 100)  # partitions taken over: the table is read
    assert active(again) == 20
    decs = real_job_fails(again, "real", T0 + 101)
    assert [d.action for d in decs] == ["blacklist"] and active(again) == 19
    assert again.metrics.extra["jobs_evicted_cheap"] == 1
