"""Fuzz: random and mutated records through every decoder and the matcher stage raise
nothing but DecodeError; random signal sequences through apply/tick never raise, never
touch another job's state, never move a run's attempt backwards or to an absurd one, and
every decision they make is a valid decisions-topic record. Seeded: a failure names its
seed and reproduces."""

from __future__ import annotations

import math
import time

import pytest

from faultwatch.core.events import Decision, RunStart
from faultwatch.core.job import MAX_ATTEMPT_STEP, JobState, apply, new_state, tick
from faultwatch.core.policy import Policy
from faultwatch.core.runs import WEAK_SOURCES, run_over
from faultwatch.errors import DecodeError
from faultwatch.rules import Matcher
from faultwatch.streams.logs_to_signals import signals_of_record
from faultwatch.wire import (
    MAX_ATTEMPT,
    LinesBatch,
    Tick,
    decode_decision,
    decode_logs,
    decode_signals,
    encode_decision,
)
from tests.fuzz.records import Gen
from tests.support.rules import builtin_ruleset

SEEDS = range(8)
RECORDS_PER_SEED = 400
SIGNALS_PER_SEED = 1500
POLICIES = [Policy(settle_s=0, max_restarts=3, node_lost_s=20, hang_window_s=10),
            Policy(settle_s=2, execution_mode="async", max_failure_rate=0.5,
                   fault_tolerant_policy="on_failure", hang_floor_s=5, hang_ceiling_s=60)]


@pytest.fixture(scope="module")
def matcher() -> Matcher:
    return Matcher(builtin_ruleset())


def _check_signal_fields(sig: object) -> None:
    for name in ("ts", "last_output_ts", "started_ts", "step_time_s", "hang_window_s"):
        v = getattr(sig, name, None)
        assert v is None or math.isfinite(v), (name, v)
    assert 0 <= sig.attempt <= MAX_ATTEMPT  # type: ignore[attr-defined]


@pytest.mark.parametrize("seed", SEEDS)
def test_decoders_and_the_matcher_stage_raise_only_decode_errors(seed: int,
                                                                 matcher: Matcher) -> None:
    g = Gen(seed)
    counts = {"ok": 0, "refused": 0}
    for i in range(RECORDS_PER_SEED):
        for make, decode in ((g.logs_record, decode_logs), (g.signals_record, decode_signals),
                             (g.decision_record, decode_decision)):
            value = make()
            mutated = i % 4 != 0  # most records mutated, some left valid (positive control)
            if mutated:
                value = g.mutate(value)
            try:
                out = decode(value)
                if decode is decode_logs:
                    if isinstance(out, LinesBatch):
                        list(out.lines)  # every row, fully checked
                    for sig in signals_of_record(out, matcher):  # type: ignore[arg-type]
                        _check_signal_fields(sig)
                elif decode is decode_signals and not isinstance(out, Tick):
                    for sig in out:  # type: ignore[union-attr]
                        _check_signal_fields(sig)
                counts["ok"] += 1
            except DecodeError as e:
                assert mutated, f"seed {seed} record {i}: a valid record refused: {e}"
                counts["refused"] += 1
            except Exception as e:  # pragma: no cover - the failure this test exists for
                raise AssertionError(f"seed {seed} record {i}: {value[:300]!r} raised {e!r}") from e
    # both outcomes happened: every valid record decoded, most mutations were refused
    assert counts["ok"] >= 3 * RECORDS_PER_SEED // 4 and counts["refused"] > RECORDS_PER_SEED


def _check_decision(d: Decision, st: JobState) -> None:
    assert d.job == st.job and d.run_id == st.run_id
    assert decode_decision(encode_decision(d)) == d  # a valid decisions-topic record


@pytest.mark.parametrize("seed", SEEDS)
def test_random_signal_sequences_never_raise_or_cross_jobs_or_runs(seed: int) -> None:
    g = Gen(seed + 1000)
    policy = POLICIES[seed % len(POLICIES)]
    states: dict[str, JobState] = {}
    decided = 0
    for i in range(SIGNALS_PER_SEED):
        now = g.tick()
        if i % 25 == 0:
            for job, st in list(states.items()):
                new, decs = tick(st, now, policy, live_clock=i % 50 == 0, caught_up=True)
                assert new.job == job and (new.run_id, new.attempt) == (st.run_id, st.attempt)
                for d in decs:
                    _check_decision(d, new)
                decided += len(decs)
                states[job] = new
            continue
        sig = g.signal()
        before = dict(states)
        st = states.get(sig.job) or new_state(sig)
        if st is None:
            assert not isinstance(sig, RunStart)
            continue
        try:
            new, decs = apply(st, sig, now, policy, "rv")
        except Exception as e:  # pragma: no cover - the failure this test exists for
            raise AssertionError(f"seed {seed} signal {i}: {sig!r} raised {e!r}") from e
        states[sig.job] = new
        # no other job changed (the same objects: nothing shared was mutated)
        assert all(states[j] is s for j, s in before.items() if j != sig.job)
        assert new.job == sig.job
        if new.run_id and new.run_id == st.run_id and new.run_gen != st.run_gen:
            # a weak id launched again once its run was over (core/runs.py): a fresh run of
            # the next generation, by a run-start of attempt 0 newer than the old run's evidence
            assert isinstance(sig, RunStart) and sig.run_source in WEAK_SOURCES
            assert new.run_gen == st.run_gen + 1 and new.attempt == 0 and run_over(st)
        elif new.run_id and new.run_id == st.run_id:  # the same run: the attempt only moves
            assert st.attempt <= new.attempt <= st.attempt + MAX_ATTEMPT_STEP  # forward, a bit
            assert new.restarts_used >= st.restarts_used
        if new.attempt != st.attempt:  # only a run-start announces an attempt
            assert isinstance(sig, RunStart) and new.attempt == sig.attempt
        for d in decs:
            _check_decision(d, new)
            assert d.attempt == new.attempt
        decided += len(decs)
    # the sequences were rich enough to reach decisions, and states still persist
    assert decided > 0
    for st in states.values():
        assert JobState.from_dict(st.to_dict()) == st


def test_the_fuzz_suite_is_quick() -> None:
    """Guard the budget (~20 s for the whole suite on a loaded 2-core machine)."""
    t0 = time.perf_counter()
    g = Gen(99)
    for _ in range(200):
        try:
            decode_logs(g.mutate(g.logs_record()))
        except DecodeError:
            pass
    assert time.perf_counter() - t0 < 5.0
