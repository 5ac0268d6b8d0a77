"""Progress through both stages (issue 14): a torchrun node's record of many ranks becomes ONE
progress signal in the matcher's bundle, and the job stage folds it into the same state as
the per-rank signals an older matcher stage sends (a mixed-version processor pair)."""

from __future__ import annotations

import functools
from typing import Any

from faultwatch import wire
from faultwatch.core.events import Line, Progress, ProgressBatch, RunStart
from faultwatch.core.policy import Policy
from faultwatch.rules import Matcher
from faultwatch.streams.job_stage import DictStore, JobStage
from faultwatch.streams.local import LocalPipeline
from faultwatch.streams.matcher_stage import MatcherStage
from faultwatch.streams.records import InRecord, LiveRules
from tests.support.rules import builtin_ruleset

T0 = 1_700_000_000.0
POLICY = Policy(settle_s=0.5, node_lost_s=5.0)
RANKS = 8


@functools.cache
def live() -> LiveRules:
    rs = builtin_ruleset()
    return LiveRules(Matcher(rs), POLICY, rs.version)


def torchrun_record(step: int, t: float) -> bytes:
    """100 lines of 8 ranks' `[rankN]:` training logs, each rank ending at `step` or one
    before it."""
    lines = [Line("stdout", step * 100 + i, t + i * 0.01,
                  f"[rank{i % RANKS}]:Step {step - (i < 92 and i % 3 == 0)}/900 | loss 2.3")
             for i in range(100)]
    return wire.encode_lines("j", 0, "n0", "r", lines)


def records() -> list[bytes]:
    return [wire.encode_run_start(RunStart("j", 0, "n0", T0, run_id="r", world_size=RANKS))] + \
        [torchrun_record(s, T0 + s) for s in range(1, 6)]


def matcher_out(values: list[bytes]) -> list[Any]:
    stage = MatcherStage(live(), lambda rec, err: None)
    out = stage.process_batch([InRecord("t.logs", 0, i, b"k", v)
                               for i, v in enumerate(values)], T0 + 10)
    sigs = []
    for _, v in out:
        got = wire.decode_signals(v)
        assert isinstance(got, list)
        sigs += got
    return sigs


def test_a_record_of_eight_ranks_is_one_progress_signal() -> None:
    sigs = matcher_out(records())
    batches = [s for s in sigs if isinstance(s, ProgressBatch)]
    assert not any(isinstance(s, Progress) for s in sigs)
    assert len(batches) == 5  # one per record, not one per rank
    assert [m.rank for m in batches[-1].marks] == [4, 5, 6, 7, 0, 1, 2, 3]  # line order
    assert {m.step for m in batches[-1].marks} == {5}
    assert [type(s).__name__ for s in sigs] == ["RunStart"] + ["Output", "ProgressBatch"] * 5


def old_form(sigs: list[Any]) -> list[Any]:
    """What an older matcher stage sent: one single-rank Progress per mark."""
    out: list[Any] = []
    for s in sigs:
        if isinstance(s, ProgressBatch):
            out += [Progress(s.job, s.attempt, s.node, m.ts, m.rank, m.step, m.total,
                             run_id=s.run_id) for m in s.marks]
        else:
            out.append(s)
    return out


def job_state(sigs: list[Any]) -> Any:
    store = DictStore()
    stage = JobStage(live(), store, lambda rec, err: None)
    value = wire.encode_bundle("j", sigs)
    assert stage.process_batch([InRecord("t.signals", 0, 0, b"j", value)], T0 + 10) == []
    return stage.load(wire.job_key("j"), stage.partition(0, T0 + 10))


def test_the_job_stage_folds_both_forms_into_the_same_state() -> None:
    sigs = matcher_out(records())
    new = job_state(sigs)
    old = job_state(old_form(sigs))
    assert new is not None and new == old and new.to_dict() == old.to_dict()
    assert len(new.progress) == RANKS and new.steps >= 4  # the control: steps were folded


def test_embedded_mode_learns_steps_from_the_batches() -> None:
    pipe = LocalPipeline(builtin_ruleset(), POLICY, node_lost=False)
    for i, v in enumerate(records()):
        assert pipe.submit(wire.log_key("j", "n0"), v, T0 + i) == []
    st = pipe.jobs.load(wire.job_key("j"), pipe.jobs.partition(0, T0 + 10))
    assert st is not None
    assert {r: p.step for r, p in st.progress.items()} == dict.fromkeys(range(RANKS), 5)
