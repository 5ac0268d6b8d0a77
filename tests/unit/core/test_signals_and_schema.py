"""Matcher-stage forwarding of progress, stages and notes; wire round trips; the decision
JSON Schema validated against real decisions of every kind."""

from __future__ import annotations

import json
from pathlib import Path

import orjson
import pytest

import faultwatch
from faultwatch.core.events import (
    Line,
    Notice,
    Output,
    Progress,
    ProgressBatch,
    RankStep,
    Stage,
)
from faultwatch.core.job import apply, tick
from faultwatch.core.matching import signals_of_lines
from faultwatch.core.pmap import PMap
from faultwatch.errors import DecodeError
from faultwatch.rules import Matcher
from faultwatch.streams.logs_to_signals import signals_of_record as signals_of
from faultwatch.wire import (
    LogsRecord,
    decision_of,
    decision_to_dict,
    decode,
    decode_logs,
    encode_notice,
    encode_signal,
    signal_of,
)
from tests.support import job_events as td
from tests.support.rules import builtin_ruleset

SCHEMA = Path(faultwatch.__file__).parent / "schemas" / "decision.schema.json"


@pytest.fixture(scope="module")
def matcher() -> Matcher:
    return Matcher(builtin_ruleset())


def note(kind: str, data: dict) -> LogsRecord:
    return decode_logs(encode_notice("j", 2, "n1", 50.0, kind, data))


def test_progress_and_stage_lines_become_signals(matcher: Matcher) -> None:
    lines = [Line("stdout", 0, 10.0, "Step 120/5000 | loss 2.31"),
             Line("stdout", 1, 11.0, "saving checkpoint at iteration 120 to /ckpt"),
             Line("stdout", 2, 12.0, "Step 121/5000 | loss 2.30")]
    sigs = signals_of_lines("j", 0, "n0", lines, matcher, rank=3, run_id="r")
    progress = [s for s in sigs if isinstance(s, ProgressBatch | Progress)]
    stages = [s for s in sigs if isinstance(s, Stage)]
    assert progress == [ProgressBatch("j", 0, "n0", (RankStep(3, 12.0, 121, 5000),), "r")]
    assert [(s.stage, s.opens, s.hang_window_s) for s in stages] == [("checkpoint", True, 3600.0)]


def test_a_batch_of_many_ranks_becomes_one_progress_signal(matcher: Matcher) -> None:
    """torchrun's `[rankN]:` prefixes: each rank's last step of the batch, in line order,
    in ONE signal (issue 14: not one signal per rank)."""
    lines = [Line("stdout", i, 10.0 + i, f"[rank{r}]:Step {s}/500 | loss 2.3")
             for i, (r, s) in enumerate([(0, 7), (1, 7), (0, 8), (2, 6), (1, 8)])]
    sigs = signals_of_lines("j", 0, "n0", lines, matcher)
    progress = [s for s in sigs if isinstance(s, ProgressBatch | Progress)]
    assert progress == [ProgressBatch("j", 0, "n0", (
        RankStep(0, 12.0, 8, 500), RankStep(2, 13.0, 6, 500), RankStep(1, 14.0, 8, 500)))]
    [o] = [s for s in sigs if isinstance(s, Output)]  # the tail: each line's rank and text
    assert [(t.rank, t.ts, t.text) for t in o.tail] == \
        [(r, 10.0 + i, f"[rank{r}]:Step {s}/500 | loss 2.3")
         for i, (r, s) in enumerate([(0, 7), (1, 7), (0, 8), (2, 6), (1, 8)])]
    assert o.ts == 14.0 and o.count == 5
    many = [Line("stdout", i, 20.0 + i, f"[rank{i % 3}]:x{i}") for i in range(12)]
    [o] = [s for s in signals_of_lines("j", 0, "n0", many, matcher) if isinstance(s, Output)]
    assert [(t.rank, t.ts, t.text) for t in o.tail] == \
        [(i % 3, 20.0 + i, f"[rank{i % 3}]:x{i}") for i in range(4, 12)]  # the last 8
    assert signals_of_lines("j", 0, "n0", lines[:0], matcher) == []
    quiet = [s for s in signals_of_lines("j", 0, "n0", [Line("stdout", 0, 1.0, "hello")],
                                         matcher) if isinstance(s, ProgressBatch)]
    assert quiet == []


def test_sdk_notes_become_signals(matcher: Matcher) -> None:
    [p] = signals_of(note("progress", {"rank": 1, "step": 7, "metrics": {"loss": 1.0},
                                       "step_time_s": 0.5}), matcher)
    assert p == Progress("j", 2, "n1", 50.0, 1, 7, step_time_s=0.5, source="sdk", loss=1.0)
    [q] = signals_of(note("progress", {"rank": 1, "step": 8, "metrics": {"loss": "nan"}}),
                     matcher)  # the SDK sends a non-finite loss as its str() (no NaN in JSON)
    assert isinstance(q, Progress) and q.loss is not None and q.loss != q.loss
    [s] = signals_of(note("stage", {"rank": 0, "stage": "eval", "opens": True,
                                    "hang_window_s": None}), matcher)
    assert s == Stage("j", 2, "n1", 50.0, 0, "eval", True, None, "sdk")
    for kind, data in [("notify", {"message": "loss is NaN", "level": "warning"}),
                       ("retryable_errors", {"patterns": ["StoreTimeout"]}),
                       ("bootcheck", {"ok": False, "checks": []}),
                       ("gap", {"dropped_lines": 3})]:
        [n] = signals_of(note(kind, data), matcher)
        assert n == Notice("j", 2, "n1", 50.0, kind, data)
    assert signals_of(note("something-new", {}), matcher) == []
    with pytest.raises(DecodeError):
        note("progress", {"rank": 1})


def test_new_signals_round_trip_on_the_wire() -> None:
    for sig in (Progress("j", 1, "n", 5.0, None, 3, 10, 0.25, "sdk"),
                Progress("j", 1, "n", 5.0, 2, 3),
                ProgressBatch("j", 1, "n", (RankStep(0, 5.0, 3, 10), RankStep(None, 5.5, -1)),
                              "r"),
                Stage("j", 1, "n", 5.0, 0, "checkpoint", False, None, "log"),
                Stage("j", 1, "n", 5.0, None, "eval", True, 30.0, "sdk"),
                Notice("j", 1, "n", 5.0, "notify", {"message": "m", "level": "info"})):
        assert signal_of(decode(encode_signal(sig))) == sig


def test_pmap_behaves_like_a_dict() -> None:
    m: PMap[int, int] = PMap()
    for i in range(200):
        m = m.set(i, i * 2)
    assert len(m) == 200 and m[150] == 300 and 199 in m and 200 not in m
    m2 = m.remove(150).set(7, 0)
    assert len(m2) == 199 and 150 not in m2 and m[7] == 14 and m2[7] == 0
    assert m == {i: i * 2 for i in range(200)} and PMap(m.to_dict()) == m


def all_kinds_of_decisions() -> list:
    """Real decisions of every kind, produced by the detector tests' scenarios."""
    from faultwatch.core.events import Exit, Heartbeat, RunStart
    from faultwatch.core.policy import Policy

    decs: list = []
    st = td.start(("n0", "n1", "n2", "n3"))
    st, d = td.slow_run(st, 0, 101.0)
    decs += d  # slow
    st = td.start()
    st, last = td.training(st, 101.0, 161.0)
    decs += td.hb(st, last + 20, last)[1]  # hang (adaptive)
    p = Policy(skew_warn_s=60, settle_s=0, node_lost_s=30, hang_needs_evidence=False)
    st = td.start(("a",), policy=p)
    st, d = apply(st, RunStart("j", 0, "b", ts=500.0), 500.0, p)
    decs += d  # skew
    decs += tick(st, 600.0, p, live_clock=True)[1]  # node-lost
    st = td.start(policy=p)
    for kind, data in [("notify", {"message": "m", "level": "info"}), ("gap", {"lines": 2}),
                       ("bootcheck", {"ok": False, "checks": [{"name": "disk", "ok": False}]})]:
        st, d = apply(st, Notice("j", 0, "n0", 101.0, kind, data), 101.0, p)
        decs += d
    st, _ = apply(st, td.hit("nvidia-xid", "hardware", 101.0), 101.0, p)
    decs += tick(st, 102.0 + p.node_lost_s, p)[1]  # blacklist (no heartbeats: fallback)
    st = td.start(("a", "b"), policy=p)
    st, _ = apply(st, Exit("j", 0, "a", 110, 0), 110, p)
    decs += apply(st, Heartbeat("j", 0, "b", 1000, True, 999), 0, p)[1]  # exit-hang
    st = td.start(policy=p)
    decs += apply(st, Exit("j", 0, "n0", 110, 3), 110, p)[1]  # exit, fail (all exited)
    # hot spares: a blacklist that swaps one in, a spare's failed checks and its loss
    st = td.start(("a", "b"), policy=p)
    for spare, checks in (("c", "passed"), ("d", "failed")):
        st, d = apply(st, Notice("j", 0, spare, 100.5, "spare", {"checks": checks}), 100.5, p)
        decs += d
    st, _ = apply(st, td.hit("nvidia-xid", "hardware", 101.0, node="b"), 101.0, p)
    for n in ("a", "b"):  # settled by both nodes' heartbeats: blacklist of b, c swapped in
        st, d = apply(st, Heartbeat("j", 0, n, 101.5, True, 101.0), 101.5, p)
        decs += d
    st = td.start(("a",), policy=p)
    st, _ = apply(st, Notice("j", 0, "c", 100.0, "spare", {}), 100.0, p)
    st, _ = apply(st, Heartbeat("j", 0, "a", 150.0, True, 150.0), 150.0, p)
    decs += tick(st, 150.0, p, live_clock=True)[1]  # the spare is lost: a notify
    return decs


def test_real_decisions_validate_against_the_published_schema() -> None:
    import jsonschema

    schema = json.loads(SCHEMA.read_text())
    jsonschema.Draft202012Validator.check_schema(schema)
    decs = all_kinds_of_decisions()
    kinds = {d.kind for d in decs}
    assert kinds >= {"slow", "hang", "skew", "node-lost", "custom", "gap", "bootcheck", "error",
                     "exit-hang", "exit"}, kinds
    assert [d.swaps for d in decs if d.swaps] == [(("b", "c"),)]
    assert any(d.evidence.get("spare") for d in decs)
    for d in decs:
        rec = orjson.loads(orjson.dumps(decision_to_dict(d)))
        jsonschema.validate(rec, schema)
        assert decision_of(rec) == d  # the published shape decodes to the same decision
    bad = orjson.loads(orjson.dumps(decision_to_dict(decs[0])))
    bad["action"] = "reboot"
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(bad, schema)
