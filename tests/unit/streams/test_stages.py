"""The matcher and job stages without a broker: batches, bundles within the size bound,
dead letters, all-or-nothing folds, ticks that survive a broken job, write-behind, and the
in-process LocalPipeline that runs both."""

from __future__ import annotations

import functools
from typing import Any

import orjson
import pytest

from faultwatch import wire
from faultwatch.core.events import Decision, Exit, Heartbeat, Line, RunStart
from faultwatch.core.policy import Policy
from faultwatch.rules import Matcher
from faultwatch.streams import job_stage as job_stage_mod
from faultwatch.streams.job_stage import DictStore, JobStage
from faultwatch.streams.local import LocalPipeline
from faultwatch.streams.matcher_stage import MatcherStage
from faultwatch.streams.records import InRecord, LiveRules
from faultwatch.wire import MAX_RECORD_BYTES, encode_bundles
from faultwatch.wire.decisions import bounded_decision
from faultwatch.wire.signals import MAX_CONTEXT_CHARS, MAX_LINE_CHARS, cap_signal
from tests.support.rules import builtin_ruleset

T0 = 1_700_000_000.0
POLICY = Policy(settle_s=0.5, node_lost_s=5.0)


@functools.cache
def ruleset() -> Any:
    return builtin_ruleset()


def live() -> LiveRules:
    rs = ruleset()
    return LiveRules(Matcher(rs), POLICY, rs.version)


class DeadLetters(list[tuple[InRecord, Exception]]):
    def __call__(self, rec: InRecord, err: Exception) -> None:
        self.append((rec, err))


def logs(i: int, value: bytes, key: bytes = b"k") -> InRecord:
    return InRecord("t.logs", 3, i, key, value)


def failing_job(job: str, t: float = T0) -> list[bytes]:
    return [wire.encode_run_start(RunStart(job, 0, "n0", t)),
            wire.encode_lines(job, 0, "n0", "r", [
                Line("stderr", 0, t, "Traceback (most recent call last):"),
                Line("stderr", 1, t, "ModuleNotFoundError: No module named 'foo'")]),
            wire.encode_exit(Exit(job, 0, "n0", t + 0.1, exit_code=1))]


def signals_of(values: list[tuple[bytes, bytes]]) -> list[Any]:
    out = []
    for _, v in values:
        out += wire.signals_of_record(wire.decode(v))
    return out


# ---- matcher stage --------------------------------------------------------------------------

def test_matcher_batch_bundles_per_job_in_order_and_dead_letters_the_bad_record() -> None:
    dead = DeadLetters()
    stage = MatcherStage(live(), dead)
    recs = [logs(i, v) for i, v in enumerate(failing_job("a"))]
    recs.insert(1, logs(99, b"not json"))
    recs += [logs(100 + i, v) for i, v in enumerate(failing_job("b"))]
    out = stage.process_batch(recs, T0 + 1)
    assert [k for k, _ in out] == [b"a", b"b"]
    kinds = [type(s).__name__ for s in signals_of(out[:1])]
    assert kinds[0] == "RunStart" and kinds[-1] == "Exit" and "Hit" in kinds
    assert len(dead) == 1 and dead[0][0].offset == 99 and dead[0][0].topic == "t.logs"
    assert "not JSON" in str(dead[0][1])
    assert stage.metrics.dead_letters == 1


def test_bundles_are_split_under_the_bound_in_order() -> None:
    raws = [orjson.dumps({"t": "hb", "job": "j", "attempt": 0, "node": f"n{i}", "ts": T0 + i,
                          "alive": True, "last_output_ts": None, "started_ts": None,
                          "pad": "x" * 300}) for i in range(200)]
    out = encode_bundles("j", raws, max_bytes=10_000)
    assert len(out) > 5
    assert all(len(v) <= 10_000 for v in out)
    nodes = [s["node"] for v in out for s in orjson.loads(v)["sigs"]]
    assert nodes == [f"n{i}" for i in range(200)]
    assert all(orjson.loads(v)["t"] == "bundle" for v in out)


def test_a_backlog_of_long_lines_never_makes_a_record_over_the_bound() -> None:
    stage = MatcherStage(live(), DeadLetters(), max_record_bytes=50_000)
    line = "x" * 3000 + " RuntimeError: NCCL error: unhandled system error " + "y" * 3000
    recs = [logs(i, wire.encode_lines("chatty", 0, "n0", "r", [
        Line("stderr", i * 10 + k, T0 + i, line) for k in range(10)])) for i in range(300)]
    out = stage.process_batch(recs, T0 + 400)
    assert len(out) > 1 and all(len(v) <= 50_000 for _, v in out)
    sigs = signals_of(out)
    assert sum(s.count for s in sigs if type(s).__name__ == "Output") == 3000


def test_cap_signal_cuts_hit_line_and_context() -> None:
    d = {"t": "hit", "job": "j", "attempt": 0, "node": "n",
         "m": {"line": "a" * 100_000, "context": ["b" * 10_000] * 100}}
    c = cap_signal(d)
    assert len(c["m"]["line"]) == MAX_LINE_CHARS
    assert sum(len(x) for x in c["m"]["context"]) <= MAX_CONTEXT_CHARS
    assert len(d["m"]["line"]) == 100_000  # the input is not changed


# ---- job stage ------------------------------------------------------------------------------

def signals_recs(out: list[tuple[bytes, bytes]], partition: int = 0) -> list[InRecord]:
    return [InRecord("t.signals", partition, i, k, v) for i, (k, v) in enumerate(out)]


def matched(job: str, t: float = T0) -> list[tuple[bytes, bytes]]:
    stage = MatcherStage(live(), DeadLetters())
    return stage.process_batch([logs(i, v) for i, v in enumerate(failing_job(job, t))], t)


def tick_rec(partition: int, sent: float) -> InRecord:
    return InRecord("t.signals", partition, 0, None, orjson.dumps({"v": 1, "t": "tick",
                                                                    "now": sent}))


def test_job_stage_decides_after_settle_and_writes_through() -> None:
    store = DictStore()
    stage = JobStage(live(), store, DeadLetters())
    decs = stage.process_batch(signals_recs(matched("a")), T0 + 0.2)
    assert b"a" in store.data  # lifecycle: written through at once
    decs += stage.process_batch([tick_rec(0, T0 + 1.0)], T0 + 1.0)
    assert [(d.job, d.action, d.kind) for d in decs] == [("a", "fail", "error")]


def test_a_record_whose_fold_raises_keeps_no_state_and_no_decision(
        monkeypatch: pytest.MonkeyPatch) -> None:
    dead = DeadLetters()
    store = DictStore()
    stage = JobStage(live(), store, dead)
    real = job_stage_mod.apply_batch

    def apply_batch(st: Any, sigs: Any, *a: Any) -> Any:
        if any(isinstance(sig, Exit) for sig in sigs):
            raise ValueError("poisoned")
        return real(st, sigs, *a)

    monkeypatch.setattr(job_stage_mod, "apply_batch", apply_batch)
    recs = signals_recs(matched("a"))
    assert stage.process_batch(recs, T0 + 0.2) == []  # the decision was not let out
    assert len(dead) == 1 and "poisoned" in str(dead[0][1])
    assert b"a" not in store.data and stage.parts[0].cache == {}
    monkeypatch.setattr(job_stage_mod, "apply_batch", real)  # positive control: same record
    assert [d.kind for d in stage.process_batch(recs, T0 + 0.2)] == ["error"]
    assert b"a" in store.data


def test_a_job_whose_tick_raises_is_set_aside_and_the_others_still_decide(
        monkeypatch: pytest.MonkeyPatch) -> None:
    stage = JobStage(live(), DictStore(), DeadLetters())
    for job in ("bad", "good"):
        stage.process_batch(signals_recs([(job.encode(), wire.encode_bundle(job, [
            RunStart(job, 0, "n0", T0), Heartbeat(job, 0, "n0", T0, True, T0, T0)]))]), T0)
    real = job_stage_mod.tick
    calls: list[str] = []

    def tick(st: Any, *a: Any, **kw: Any) -> Any:
        calls.append(st.job)
        if st.job == "bad":
            raise TypeError("'<' not supported between instances of 'str' and 'int'")
        return real(st, *a, **kw)

    monkeypatch.setattr(job_stage_mod, "tick", tick)
    decs: list[Decision] = []
    for i in range(1, 30):  # processor time runs on; no heartbeats: node lost
        now = T0 + i
        decs += stage.process_batch([tick_rec(0, now)], now)
    assert [(d.job, d.kind) for d in decs] == [("good", "node-lost")]
    assert calls.count("bad") == 1  # set aside, not retried every tick
    assert stage.metrics.extra["jobs_broken"] == 1


def test_node_lost_waits_while_the_logs_are_behind_and_gives_a_full_window_after() -> None:
    """A node's heartbeats may wait in a logs backlog the shell has not read: processor
    time declares no node lost while the shell says the logs are behind, and after it
    catches up every node gets a full window again (the fleet bench's false node-losts)."""
    def run(behind_until_s: float) -> list[tuple[str, float]]:
        stage = JobStage(live(), DictStore(), DeadLetters())
        stage.process_batch(signals_recs([(b"j", wire.encode_bundle("j", [
            RunStart("j", 0, "n0", T0), Heartbeat("j", 0, "n0", T0, True, T0, T0)]))]), T0)
        out = []
        for i in range(1, 60):
            now = T0 + i
            stage.logs_caught_up = i >= behind_until_s
            out += [(d.kind, now - T0) for d in stage.process_batch([tick_rec(0, now)], now)]
        return out

    grace = POLICY.node_lost_s + job_stage_mod.GRACE_S
    # positive control: caught up all along, the silent node is lost after the grace
    assert run(0) == [("node-lost", grace)]
    # behind until 20 s: nothing then, and a full grace from the last tick that was behind
    assert run(20) == [("node-lost", 19 + grace)]


def test_the_matcher_stage_keeps_the_offset_after_what_it_processed() -> None:
    stage = MatcherStage(live(), DeadLetters())
    recs = [logs(i + 40, v) for i, v in enumerate(failing_job("a"))] + [logs(99, b"{")]
    stage.process_batch(recs, T0)
    assert stage.logs_next_offset == {3: 100}  # the bad record counts as processed
    stage.on_revoked([3])
    assert stage.logs_next_offset == {}


def test_liveness_is_written_behind_and_flushed_on_revocation() -> None:
    store = DictStore()
    stage = JobStage(live(), store, DeadLetters())
    start = wire.encode_bundle("j", [RunStart("j", 0, "n0", T0)])
    stage.process_batch(signals_recs([(b"j", start)]), T0)
    written = store.data[b"j"]
    stage.process_batch(signals_recs([(b"j", wire.encode_bundle("j", [
        Heartbeat("j", 0, "n0", T0 + 1, True, T0 + 1, T0)]))]), T0 + 1)
    assert store.data[b"j"] == written and stage.dirty == 1  # held back
    assert stage.on_revoked([0], T0 + 1.5) == 1
    assert store.data[b"j"] != written and stage.dirty == 0
    # a new owner finds the active job in the store and ticks it
    stage2 = JobStage(live(), DictStore(store.data), DeadLetters())
    stage2.process_batch([tick_rec(0, T0 + 2)], T0 + 2)
    assert stage2.parts[0].active == {b"j"}


def test_bounded_decision_cuts_evidence_only() -> None:
    dec = Decision(id="x1", job="j", attempt=0, action="fail", kind="error", ts=T0,
                   nodes=("n0",), ranks=(0,), rule="r", category="fatal", message="m",
                   evidence={"lines": ["z" * 50_000] * 100, "first": {"node": "n0"}},
                   budgets={}, rules_version="v")
    assert len(wire.encode_decision(dec)) > MAX_RECORD_BYTES
    small = bounded_decision(dec)
    assert len(wire.encode_decision(small)) <= MAX_RECORD_BYTES
    assert (small.id, small.action, small.nodes) == (dec.id, dec.action, dec.nodes)
    assert small.evidence["truncated"] is True and small.evidence["first"] == {"node": "n0"}
    assert bounded_decision(small) is small
    tiny = bounded_decision(dec, 10_000)  # nothing of the evidence fits: only what acts
    assert len(wire.encode_decision(tiny)) <= 10_000 and tiny.evidence == {"truncated": True}


# ---- the in-process pipeline ----------------------------------------------------------------

def test_local_pipeline_decides_a_failing_job_and_a_lost_node() -> None:
    pipe = LocalPipeline(ruleset(), POLICY)
    decs: list[Decision] = []
    for v in failing_job("a"):
        decs += pipe.submit(wire.log_key("a", "n0"), v, T0 + 0.2)
    decs += pipe.tick(T0 + 1.0)
    assert [(d.job, d.action, d.kind) for d in decs] == [("a", "fail", "error")]
    # a node that goes quiet: node-lost once the grace (node_lost_s + 5 s) has passed
    pipe.submit(wire.log_key("b", "n0"), wire.encode_run_start(RunStart("b", 0, "n0", T0)),
                T0 + 1)
    lost = [d for i in range(2, 40) for d in pipe.tick(T0 + i)]
    assert [(d.job, d.kind) for d in lost] == [("b", "node-lost")]


def test_local_pipeline_dead_letters_a_bad_record_and_goes_on() -> None:
    dead = DeadLetters()
    pipe = LocalPipeline(ruleset(), POLICY, dead_letter=dead)
    assert pipe.submit(b"x", b"{", T0) == []
    assert len(dead) == 1 and dead[0][0].topic == "local.logs"
    decs = [d for v in failing_job("a") for d in pipe.submit(wire.log_key("a", "n0"), v, T0)]
    assert [d.kind for d in decs + pipe.tick(T0 + 1)] == ["error"]


def test_local_pipeline_without_node_lost_never_declares_one() -> None:
    for node_lost, want in ((False, []), (True, [("b", "node-lost")])):  # with its control
        pipe = LocalPipeline(ruleset(), POLICY, node_lost=node_lost)
        pipe.submit(wire.log_key("b", "n0"), wire.encode_run_start(RunStart("b", 0, "n0", T0)),
                    T0)
        lost = [d for i in range(1, 40) for d in pipe.tick(T0 + i)]
        assert [(d.job, d.kind) for d in lost] == want


def test_a_logged_nan_loss_then_an_ecc_error_blacklists_the_node() -> None:
    """The NaN is a divergence notice; the failure after it is decided by its own error."""
    p = LocalPipeline(ruleset(), POLICY)
    decs = p.submit(b"j", wire.encode_run_start(RunStart("j", 0, "n0", T0)), T0)
    decs += p.submit(b"j", wire.encode_lines("j", 0, "n0", "r", [
        Line("stdout", 0, T0 + 1, "{'loss': nan, 'grad_norm': nan, 'epoch': 0.1}")]), T0 + 1)
    decs += p.submit(b"j", wire.encode_lines("j", 0, "n0", "r", [
        Line("stderr", 1, T0 + 5, "ncclUnhandledCudaError: Call to CUDA function failed."),
        Line("stderr", 2, T0 + 5, "Last error:"),
        Line("stderr", 3, T0 + 5, "Cuda failure 'uncorrectable ECC error encountered'")]),
        T0 + 5)
    decs += p.submit(b"j", wire.encode_exit(Exit("j", 0, "n0", T0 + 6, exit_code=1)), T0 + 6)
    for t in range(7, 12):
        decs += p.tick(T0 + t)
    assert [(d.action, d.kind) for d in decs] == [("notify", "divergence"),
                                                  ("blacklist", "error")], decs
    assert decs[1].rule == "cuda-ecc-uncorrectable" and decs[1].nodes == ("n0",)
