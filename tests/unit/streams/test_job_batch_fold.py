"""The job stage folds each job once per batch: one state read and write per job however
many of its records the batch holds, the same states and decisions as one record at a time,
ticks as barriers, and a record that raises dead-lettered without costing its job's others."""

from __future__ import annotations

from typing import Any

import orjson
import pytest

from faultwatch import wire
from faultwatch.core.events import Exit, Heartbeat, Line, Output, RunStart, TailLine
from faultwatch.streams import job_stage as job_stage_mod
from faultwatch.streams.job_stage import DictStore, JobStage
from faultwatch.streams.matcher_stage import MatcherStage
from faultwatch.streams.records import InRecord
from tests.support.stages import T0, DeadLetters, live, logs, tick_rec


class CountingStore(DictStore):
    def __init__(self) -> None:
        super().__init__()
        self.gets: list[bytes] = []
        self.puts: list[bytes] = []
        self.folds: list[str] = []  # the jobs of the stage's folds (run() counts them)

    def get(self, key: bytes) -> bytes | None:
        self.gets.append(key)
        return super().get(key)

    def put(self, partition: int, key: bytes, value: bytes) -> None:
        self.puts.append(key)
        super().put(partition, key, value)


def job_records(job: str, nodes: int = 3, fail: bool = True) -> list[bytes]:
    """A job's records as the matcher stage sends them: one bundle per record."""
    out = [wire.encode_bundle(job, [RunStart(job, 0, f"n{k}", T0, world_size=nodes)])
           for k in range(nodes)]
    for s in range(4):
        for k in range(nodes):
            ts = T0 + 1 + s
            out.append(wire.encode_bundle(job, [
                Output(job, 0, f"n{k}", ts, 1, rank_last_ts=((k, ts),),
                       tail=(TailLine(k, ts, f"step {s}"),)),
                Heartbeat(job, 0, f"n{k}", ts + 0.1, True, ts, T0)]))
    if fail:  # node 1 fails; node 0's next heartbeat is past the settle time (event time)
        out.append(wire.encode_bundle(job, [Exit(job, 0, "n1", T0 + 6, exit_code=1)]))
        out.append(wire.encode_bundle(job, [Heartbeat(job, 0, "n0", T0 + 8, True, T0 + 4,
                                                      T0)]))
    return out


def recs(values: list[bytes]) -> list[InRecord]:
    return [InRecord("t.signals", 0, i, None, v) for i, v in enumerate(values)]


def interleaved() -> list[bytes]:
    a, b = job_records("a", 2), job_records("b", 3, fail=False)
    return [v for pair in zip(a, b, strict=False) for v in pair] + a[len(b):]


def run(batches: list[list[bytes]]) -> tuple[Any, list[Any], CountingStore]:
    store = CountingStore()
    stage = JobStage(live(), store, DeadLetters())
    real = stage._fold  # noqa: SLF001

    def fold(partition: int, sigs: Any, now: float) -> Any:
        store.folds.append(sigs[0].job)
        return real(partition, sigs, now)

    stage._fold = fold  # type: ignore[method-assign]  # noqa: SLF001
    decs = []
    for batch in batches:
        decs += stage.process_batch(recs(batch), T0 + 7)
    decs += stage.process_batch([tick_rec(0, T0 + 9)], T0 + 9)
    stage.flush(T0 + 20)
    return {k: orjson.loads(v) for k, v in store.data.items()}, decs, store


def test_one_read_and_one_write_per_job_per_batch_with_one_at_a_time_results() -> None:
    values = interleaved()
    states, decs, store = run([values])
    # the peer: every record a batch of its own
    one_states, one_decs, one_store = run([[v] for v in values])
    assert states == one_states
    assert [(d.id, d.job, d.kind, d.action) for d in decs] == \
        [(d.id, d.job, d.kind, d.action) for d in one_decs]
    assert [d.kind for d in decs if d.job == "a"] == ["exit"]
    # one fold, one load from the store (then cached), one durable write per job per batch
    assert sorted(store.folds) == ["a", "b"]
    assert len(one_store.folds) == len(values)  # the peer: a fold per record
    assert store.gets.count(b"a") == 1 and store.gets.count(b"b") == 1
    batch_puts = store.puts[:2]
    assert sorted(batch_puts) == [b"a", b"b"]
    assert one_store.puts.count(b"a") > 3  # the peer writes per record


def test_a_tick_sees_every_signal_before_it(monkeypatch: pytest.MonkeyPatch) -> None:
    """A tick of a partition is a barrier: the records before it are folded when it runs,
    the ones after it are folded after it (processor time as the records' order says)."""
    stage = JobStage(live(), DictStore(), DeadLetters())
    seen: list[int] = []
    real = stage._tick  # noqa: SLF001

    def tick(partition: int, sent: float, now: float) -> Any:
        seen.append(stage.parts[0].cache[b"a"].outputs)
        return real(partition, sent, now)

    monkeypatch.setattr(stage, "_tick", tick)
    values = job_records("a", 2, fail=False)  # 2 starts, then 8 records of one output each
    batch = [*recs(values[:5]), tick_rec(0, T0 + 10), *recs(values[5:]),
             tick_rec(0, T0 + 11)]
    stage.process_batch(batch, T0 + 10)
    assert seen == [3, 8]


def test_a_record_that_raises_is_dead_lettered_and_its_jobs_other_records_fold(
        monkeypatch: pytest.MonkeyPatch) -> None:
    dead = DeadLetters()
    stage = JobStage(live(), DictStore(), dead)
    real = job_stage_mod.apply_batch

    def apply_batch(st: Any, sigs: Any, *a: Any) -> Any:
        if any(isinstance(s, Output) and s.ts == T0 + 2 and s.node == "n1" for s in sigs):
            raise ValueError("poisoned")
        return real(st, sigs, *a)

    monkeypatch.setattr(job_stage_mod, "apply_batch", apply_batch)
    decs = stage.process_batch(recs(job_records("a", 2)), T0 + 7)
    decs += stage.process_batch([tick_rec(0, T0 + 9)], T0 + 9)
    assert len(dead) == 1 and "poisoned" in str(dead[0][1])
    assert [d.kind for d in decs] == ["exit"]  # the exit (a later record) still folded
    st = stage.parts[0].cache[b"a"]
    assert st.nodes["n1"].last_hb_ts == T0 + 4.1  # ... and so did its other records


def test_lines_of_one_job_from_two_nodes_fold_as_in_the_matcher_order() -> None:
    """(what the fleet sends: records of one job from several matcher batches)"""
    m = MatcherStage(live(), DeadLetters())
    out = []
    for k in range(3):
        out += m.process_batch([logs(0, wire.encode_lines("j", 0, f"n{k}", "r", [
            Line("stdout", 0, T0 + k, f"[rank{k}]: step {k + 1}/10")]))], T0 + k)
    start = [wire.encode_bundle("j", [RunStart("j", 0, f"n{k}", T0)]) for k in range(3)]
    states, _, _ = run([start + [v for _, v in out]])
    one_states, _, _ = run([[v] for v in start + [v for _, v in out]])
    assert states == one_states and states[b"j"].get("steps", 0) >= 0  # (stored sparse)
