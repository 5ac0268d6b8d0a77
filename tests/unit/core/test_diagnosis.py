"""Hang diagnosis in the job state: the `diagnose` request, the agents' answers, the culprit in
words, a checkpoint write deferring the decision (bounded), repeated culprits as suspects."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import faultwatch
from faultwatch.core.events import Notice, Output, RunStart
from faultwatch.core.folds import new_attempt
from faultwatch.core.job import JobState, apply
from faultwatch.core.policy import Policy
from tests.support.flight_recorder import dump, entry
from tests.support.job_events import out, prog

P = Policy(hang_window_s=20, settle_s=0, max_restarts=10, checkpoint_extend_s=200)
COLL = {"state": "collective", "op": "all_reduce", "at": "train.py:40 in step",
        "frames": ["distributed_c10d.py:2500 in all_reduce", "train.py:40 in step"]}
SLEEP = {"state": "elsewhere", "op": None, "at": "train.py:42 in on_step_end",
         "frames": ["train.py:42 in on_step_end"]}
SAVE = {"state": "checkpoint", "op": "save", "at": "trainer.py:900 in _save",
        "frames": ["serialization.py:650 in _save", "trainer.py:900 in _save"]}


def beat(st: JobState, ts: float, last: float, attempt: int = 0) -> tuple[JobState, list]:
    from faultwatch.core.events import Heartbeat

    return apply(st, Heartbeat("j", attempt, "n0", ts, True, last), ts, P)


def answer(st: JobState, ts: float, ranks: dict[int, dict[str, Any]],
           fr: dict[int, dict[str, Any]] | None = None, attempt: int = 0) -> JobState:
    data = {"request": "x", "ranks": {str(r): {"stack": s, "source": "py-spy",
                                               "fr": json.dumps(fr[r]) if fr else None}
                                      for r, s in ranks.items()}}
    st, decs = apply(st, Notice("j", attempt, "n0", ts, "diagnosis", data), ts, P)
    assert decs == []
    return st


def silent_job(attempt: int = 0, st: JobState | None = None) -> tuple[JobState, float]:
    st = st or JobState(job="j")
    if attempt:
        st = new_attempt(st, attempt)
    st, _ = apply(st, RunStart("j", attempt, "n0", 100.0, world_size=2), 100.0, P)
    for t in (101.0, 102.0, 103.0):
        st = out(st, t, attempt=attempt, policy=P)
        st, _ = prog(st, t, int(t), attempt=attempt, policy=P)
    return st, 103.0


def run_until(st: JobState, last: float, t: float, until: float, kinds: set[str]
              ) -> tuple[JobState, float, list]:
    seen: list = []
    while t < until:
        t += 1.0
        st, decs = beat(st, t, last, st.attempt)
        seen.extend(decs)
        if any(d.kind in kinds for d in decs):
            break
    return st, t, seen


def test_request_at_half_window_then_the_culprit_in_words() -> None:
    st, last = silent_job()
    st, t, decs = run_until(st, last, last, last + 30, {"diagnose"})
    assert [(d.kind, d.action) for d in decs] == [("diagnose", "notify")]
    assert t - last == 10.0  # half the 20 s window
    fr = {0: dump([entry(i) for i in range(1, 27)], 26, 25),
          1: dump([entry(i) for i in range(1, 26)], 25, 25)}
    st = answer(st, t + 1.5, {0: COLL, 1: SLEEP}, fr)
    st, t, decs = run_until(st, last, t, last + 40, {"hang"})
    assert [d.kind for d in decs] == ["hang"] and t - last == 20.0
    h = decs[0]
    assert h.ranks == (1,)
    assert ("rank 0 waits in all_reduce #26 (3\u00d74 float); rank 1 never entered it "
            "(rank 1 last entered #25); rank 1 is at train.py:42 in on_step_end") in h.message
    assert h.evidence["culprit_basis"] == "flight recorder"
    assert h.evidence["diagnosis"]["stacks"]["ranks"]["1"]["at"] == "train.py:42 in on_step_end"


def test_stacks_alone_name_the_rank_outside_the_collective() -> None:
    st, last = silent_job()
    st, t, _ = run_until(st, last, last, last + 30, {"diagnose"})
    st = answer(st, t, {0: COLL, 1: SLEEP})
    st, t, decs = run_until(st, last, t, last + 40, {"hang"})
    assert decs[-1].ranks == (1,) and decs[-1].evidence["culprit_basis"] == "stacks"
    assert "rank 0 in all_reduce; rank 1 is at train.py:42 in on_step_end" in decs[-1].message


def test_no_answer_falls_back_to_the_labelled_guess() -> None:
    st, last = silent_job()
    st = out(st, last + 0.5, rank=1, policy=P)  # rank 1 printed last
    st, t, decs = run_until(st, last + 0.5, last + 0.5, last + 40, {"hang"})
    h = [d for d in decs if d.kind == "hang"][0]
    assert h.evidence["culprit_basis"].startswith("went quiet first (a guess")
    assert "(a guess)" in h.message


def test_checkpoint_write_defers_the_hang_within_the_bound_and_says_so() -> None:
    st, last = silent_job()
    st, t, _ = run_until(st, last, last, last + 30, {"diagnose"})
    st = answer(st, t, {0: SAVE, 1: COLL})
    kinds: list[str] = []
    while t < last + 60:  # 3x the window: the save goes on, every request answered
        t += 1.0
        st, decs = beat(st, t, last)
        kinds += [d.kind for d in decs]
        if decs and decs[-1].kind == "diagnose":
            st = answer(st, t + 0.5, {0: SAVE, 1: COLL})
    assert "hang" not in kinds
    assert kinds.count("hang-deferred") == 1 and kinds.count("diagnose") >= 2
    # positive control: the save ends but the silence goes on -> a hang, rank 0 not excused
    st, t, decs = run_until(st, last, t, last + 400, {"diagnose", "hang"})
    if decs[-1].kind == "diagnose":
        st = answer(st, t + 0.5, {0: SLEEP, 1: COLL})
        st, t, decs = run_until(st, last, t, last + 400, {"hang"})
    assert decs[-1].kind == "hang" and decs[-1].ranks == (0,)


def test_checkpoint_extension_is_bounded() -> None:
    st, last = silent_job()
    t, decs = last, []
    while t < last + 400 and not any(d.kind == "hang" for d in decs):
        t += 1.0
        st, decs = beat(st, t, last)
        if decs and decs[-1].kind == "diagnose":
            st = answer(st, t, {0: SAVE, 1: COLL})
    assert any(d.kind == "hang" for d in decs)
    assert 200.0 <= t - last <= 221.0  # checkpoint_extend_s


def test_answers_from_before_the_silence_are_ignored_and_output_clears_them() -> None:
    st, last = silent_job()
    st = answer(st, last - 5, {0: SAVE, 1: COLL})  # an old answer: not about this silence
    assert st.diagnoses
    st, _ = apply(st, Output("j", 0, "n0", last + 0.1, 1, ((0, last + 0.1),)), last, P)
    assert not st.diagnoses


def test_a_node_that_causes_repeated_hangs_becomes_a_blacklist_candidate() -> None:
    st, last = silent_job()
    for attempt in (0, 1):
        if attempt:
            st, last = silent_job(attempt, st)
        st, t, _ = run_until(st, last, last, last + 30, {"diagnose"})
        st = answer(st, t, {0: COLL, 1: SLEEP}, attempt=attempt)
        st, t, decs = run_until(st, last, t, last + 40, {"hang"})
        assert decs[-1].kind == "hang"
    assert st.hang_culprits["n0"] == 2
    assert decs[-1].evidence.get("blacklist_candidates") == ["n0"]


def test_diagnosis_decisions_validate_against_the_published_schema() -> None:
    import jsonschema
    import orjson

    from faultwatch.wire import decision_to_dict
    SCHEMA = Path(faultwatch.__file__).parent / "schemas" / "decision.schema.json"

    st, last = silent_job()
    st, t, decs = run_until(st, last, last, last + 30, {"diagnose"})
    st = answer(st, t, {0: SAVE, 1: COLL})
    st, t, more = run_until(st, last, t, last + 60, {"hang-deferred"})
    decs += more
    st2, last2 = silent_job()
    st2, t2, _ = run_until(st2, last2, last2, last2 + 30, {"diagnose"})
    st2 = answer(st2, t2, {0: COLL, 1: SLEEP})
    decs += run_until(st2, last2, t2, last2 + 40, {"hang"})[2]
    assert {d.kind for d in decs} >= {"diagnose", "hang-deferred", "hang"}
    schema = orjson.loads(SCHEMA.read_bytes())
    for d in decs:
        jsonschema.validate(orjson.loads(orjson.dumps(decision_to_dict(d))), schema)



def test_a_checkpoint_silence_teaches_the_window_nothing() -> None:
    st, last = silent_job()
    st, t, _ = run_until(st, last, last, last + 30, {"diagnose"})
    st = answer(st, t, {0: SAVE, 1: COLL})
    while t < last + 60:
        t += 1.0
        st, decs = beat(st, t, last)
        if decs and decs[-1].kind == "diagnose":
            st = answer(st, t + 0.5, {0: SAVE, 1: COLL})
    for i in range(1, 5):  # training goes on after the save
        st = out(st, t + i, policy=P)
        st, _ = prog(st, t + i, 200 + i, policy=P)
    assert all((h.max() or 0) < 30 for h in st.hists.values()), st.hists


def test_the_hang_names_the_probes_of_its_silence_and_what_they_found() -> None:
    """The probes go to the control topic, so the hang's own evidence and message say which
    were sent and which nodes answered (one notification for the hang, not one per probe)."""
    st, last = silent_job()
    st, t, decs = run_until(st, last, last, last + 30, {"diagnose"})
    (probe,) = decs
    st = answer(st, t + 1.5, {0: COLL, 1: SLEEP})
    st, t, decs = run_until(st, last, t, last + 40, {"hang"})
    (hang,) = [d for d in decs if d.kind == "hang"]
    probes = hang.evidence["probes"]
    assert [s["id"] for s in probes["sent"]] == [probe.id]
    assert probes["sent"][0]["ts"] == last + 10.0
    assert set(probes["answered"]) == {"n0"}
    assert (probes["answered"]["n0"]["request"], probes["answered"]["n0"]["ranks"]) == ("x", 2)
    assert "[1 probe(s) of stacks during the silence, 1 node(s) answered]" in hang.message
