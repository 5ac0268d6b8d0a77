"""Wire decoders validate at the boundary: every malformed record is a DecodeError that
names the field, good records (old and new shapes) decode unchanged."""

from __future__ import annotations

import orjson
import pytest

from faultwatch.core.events import (
    Decision,
    Exit,
    Heartbeat,
    Line,
    Notice,
    Progress,
    RunStart,
    Stage,
)
from faultwatch.core.matching import signals_of_lines
from faultwatch.errors import DecodeError
from faultwatch.rules.classify import matcher_for
from faultwatch.wire import (
    MAX_ID_CHARS,
    LinesBatch,
    Tick,
    decision_of,
    decision_to_dict,
    decode_decision,
    decode_logs,
    decode_signals,
    encode_decision,
    encode_exit,
    encode_heartbeat,
    encode_line_chunks,
    encode_lines,
    encode_notice,
    encode_run_start,
    encode_tick,
    lines_of,
    signal_dict,
    signal_of,
)
from tests.support.rules import builtin_ruleset


def rec(**kw: object) -> bytes:
    return orjson.dumps({"v": 1, **kw})


LINES = {"t": "lines", "job": "j", "attempt": 0, "node": "n0", "run_id": "r",
         "lines": [["e", 0, 1.0, "hello", 0, 0]]}
DEC = Decision(id="0123456789abcdef0123", job="j", attempt=1, action="restart", kind="hang",
               ts=5.0, nodes=("n0", "n1"), ranks=(3,), message="m", evidence={"a": [1, 2.5]},
               budgets={"restarts_used": 1}, rules_version="v", run_id="r-1",
               scheduler={"kind": "slurm", "job_id": "7", "labels": {"team": "x"}})


def test_every_logs_record_type_round_trips() -> None:
    start = RunStart("j", 2, "n0", 1.0, run_id="123", world_size=8, nnodes=2, rank=None,
                     local_ranks=(0, 1), host="h", pid=7, cmd=("python", "t.py"),
                     agent_version="1", run_source="slurm",
                     scheduler={"kind": "slurm", "job_id": "123", "node": "n0"})
    assert decode_logs(encode_run_start(start)) == start
    hb = Heartbeat("j", 2, "n0", 2.0, True, 1.5, 1.0)
    assert decode_logs(encode_heartbeat(hb, "123")) == Heartbeat("j", 2, "n0", 2.0, True, 1.5,
                                                                 1.0, run_id="123")
    ex = Exit("j", 2, "n0", 3.0, exit_code=137, signal=9)
    assert decode_logs(encode_exit(ex, "123")) == Exit("j", 2, "n0", 3.0, 137, 9, run_id="123")
    n = decode_logs(encode_notice("j", 2, "n0", 4.0, "notify", {"message": "hi"}, run_id="123"))
    assert n == Notice("j", 2, "n0", 4.0, "notify", {"message": "hi"}, run_id="123")
    b = decode_logs(encode_lines("j", 2, "n0", "123", [Line("stderr", 5, 6.0, "x", 1, 9)], 4))
    assert isinstance(b, LinesBatch) and (b.run_id, b.rank, b.lines.texts) == ("123", 4, ["x"])
    assert list(b.lines) == [Line("stderr", 5, 6.0, "x", 1, 9)]


def test_older_records_without_new_fields_still_decode() -> None:
    old_start = rec(t="start", job="j", attempt=0, node="n", ts=1.0, world_size=None)
    assert decode_logs(old_start) == RunStart("j", 0, "n", 1.0)
    old_lines = rec(**{**LINES, "lines": [["o", 0, 1.0, "short row"]]})  # 4 fields
    batch = decode_logs(old_lines)
    assert isinstance(batch, LinesBatch) and batch.lines[0] == Line("stdout", 0, 1.0, "short row")
    d = decision_to_dict(DEC)
    del d["run_id"], d["scheduler"]
    assert decision_of(d).run_id == "" and decision_of(d).scheduler == {}


def test_chunked_lines_records_decode_to_the_same_lines_as_row_records() -> None:
    lines = [Line("stdout", 7, 2.0, "a"), Line("stdout", 8, 2.0, ""), Line("stdout", 9, 2.0, "c"),
             Line("stderr", 0, 2.5, "cut", 1, 9000), Line("stdout", 10, 3.0, "d \u00e9")]
    chunks = [Line("stdout", 7, 2.0, "a\n\nc"), Line("stderr", 0, 2.5, "cut", 1, 9000),
              Line("stdout", 10, 3.0, "d \u00e9")]
    old = decode_logs(encode_lines("j", 1, "n0", "r", lines, 3))
    new = decode_logs(encode_line_chunks("j", 1, "n0", "r", chunks, 3))
    assert isinstance(old, LinesBatch) and isinstance(new, LinesBatch)
    assert (new.job, new.attempt, new.node, new.run_id, new.rank) == ("j", 1, "n0", "r", 3)
    assert new.lines.texts == old.lines.texts == ["a", "", "c", "cut", "d \u00e9"]
    assert list(new.lines) == list(old.lines) == lines
    assert new.lines[-1] == lines[-1] and new.lines[1:3] == lines[1:3]
    d = orjson.loads(encode_line_chunks("j", 1, "n0", "r", chunks))
    assert lines_of(d) == lines and "lines" not in d


def test_indexed_lines_are_kept_and_bad_rows_fail_each_time() -> None:
    """LineRows keeps a Line it built (the stage reads the tail and each rank's last line
    several times); each index its own line, a malformed row a DecodeError at every read."""
    lines = [Line("stdout", i, 1.0 + i, f"t{i}") for i in range(5)]
    for raw in (encode_lines("j", 0, "n", "r", lines),
                encode_line_chunks("j", 0, "n", "r", [Line("stdout", 0, 1.0, "t0\nt1")])):
        got = decode_logs(raw)
        assert isinstance(got, LinesBatch)
        rows = got.lines
        n = len(rows)
        for i in [*range(n), *range(-n, 0), -1, 0]:
            assert rows[i] == (lines[i % n] if n == 5 else Line("stdout", i % n, 1.0,
                                                                  f"t{i % n}"))
        assert rows[-1] is rows[-1] and rows[0] is rows[0]
        with pytest.raises(IndexError):
            rows[n]
    d = orjson.loads(encode_lines("j", 0, "n", "r", lines))
    d["lines"][3][1] = "seven"  # a bad seq: found when that line is read, every time
    bad = decode_logs(orjson.dumps(d))
    assert isinstance(bad, LinesBatch)
    assert bad.lines[4] == lines[4]
    for _ in range(2):
        with pytest.raises(DecodeError, match="line row seq"):
            bad.lines[3]


def test_a_records_times_are_a_checked_column_equal_to_its_lines_times() -> None:
    """LineRows.times (the matcher reads a line's time without building its Line) holds what
    each Line's ts holds, floats from integer times too, for rows and chunks; a time that a
    Line would refuse makes the whole record a DecodeError, whichever line holds it."""
    lines = [Line("stdout", 0, 5, "a"), Line("stdout", 1, 6.5, "b"), Line("stderr", 0, 0, "c")]
    for raw in (encode_lines("j", 0, "n", "r", lines),
                encode_line_chunks("j", 0, "n", "r", [Line("stdout", 0, 7, "a\nb"),
                                                      Line("stderr", 3, 8.5, "c")])):
        got = decode_logs(raw)
        assert isinstance(got, LinesBatch)
        assert got.lines.times == [ln.ts for ln in got.lines]
        assert all(type(t) is float for t in got.lines.times)
    d = orjson.loads(encode_lines("j", 0, "n", "r", lines))
    for bad in (True, -1.0, 1e12, "5", None):
        d["lines"][1][2] = bad  # (a middle line: no Line of it is built when decoding)
        with pytest.raises(DecodeError, match="line time"):
            decode_logs(orjson.dumps(d))
    d["lines"][1][2] = 123456789
    huge = orjson.dumps(d).replace(b"123456789", b"9" * 30)  # (orjson reads it as a float)
    with pytest.raises(DecodeError, match="line time"):
        decode_logs(huge)


TB = ["Traceback (most recent call last):", '  File "train.py", line 3, in <module>',
      "RuntimeError: CUDA error: an illegal memory access was encountered"]
COLUMN_BATCHES = {
    "ranked steps": [f"[rank{r}]: step {s}/900 | loss {2 + s / 100:.2f} | lr 3e-4"
                     for s in range(20) for r in range(4)],
    "plain steps and a loss": [f"step {s} loss={2 + s / 100:.3f}" for s in range(30)],
    "a nan loss and a stage": ["[rank0]: step 3 loss=nan", "[rank1]: saving checkpoint at 9",
                               "[rank1]: step 4/10 | loss: 2.5", "[rank0]: 45%| 450/1000 [01:2"],
    "a traceback": ["[rank1]: step 7", *(f"[rank1]: {t}" for t in TB), "[rank0]: step 8"],
    "merged output": ["[rank0]: step 1[rank1]: step 2", "[rank2]:  12%| 120/1000 [00:3"],
    "srun labels": [f"{r}: step {s} | loss: 1.{s}" for s in range(5) for r in range(3)],
}


@pytest.mark.parametrize("name", COLUMN_BATCHES)
def test_a_decoded_records_signals_are_those_of_its_lines(name: str) -> None:
    """The matcher and the signals read a decoded record's times and texts as columns
    (no Line built for them): the signals are those of the same lines as Line objects."""
    m = matcher_for(builtin_ruleset())  # (cached: shared with the other tests)
    texts = COLUMN_BATCHES[name]
    lines = [Line("stderr" if i % 3 else "stdout", i, 1000 + i // 2 if i % 2 else 1000.5 + i,
                  t) for i, t in enumerate(texts)]
    for raw in (encode_lines("j", 0, "n", "r", lines), encode_line_chunks("j", 0, "n", "r", lines)):
        got = decode_logs(raw)
        assert isinstance(got, LinesBatch)
        dicts = [orjson.dumps(signal_dict(s)) for s in
                 signals_of_lines("j", 0, "n", got.lines, m, run_id="r")]
        want = [orjson.dumps(signal_dict(s)) for s in
                signals_of_lines("j", 0, "n", list(got.lines), m, run_id="r")]
        assert dicts == want
        assert len(dicts) > 1  # (an output and more: hits, steps, stages or losses)


@pytest.mark.parametrize("chunk, why", [
    (["o", 0, 1.0, "a\nb", 1, 0], "flags or orig_len on a chunk of several lines"),
    (["o", 0, -1.0, "a", 0, 0], "line chunk ts"),
    (["o", "0", 1.0, "a", 0, 0], "line chunk seq0"),
    (["o", 0, 1.0, 5, 0, 0], "line chunk text"),
    (["o", 0, 1.0, "a"], "line chunk"),
])
def test_malformed_line_chunks_are_decode_errors(chunk: list, why: str) -> None:
    raw = orjson.dumps({"v": 1, **{k: v for k, v in LINES.items() if k != "lines"},
                        "chunks": [chunk]})
    with pytest.raises(DecodeError, match=why):
        decode_logs(raw)


def test_a_chunk_record_over_the_line_limit_is_a_decode_error() -> None:
    raw = rec(**{**{k: v for k, v in LINES.items() if k != "lines"},
                 "chunks": [["o", 0, 1.0, "\n" * 100_000, 0, 0]]})
    with pytest.raises(DecodeError, match="more than 100000 lines"):
        decode_logs(raw)


def test_sdk_notes_are_decoded_once_into_signals() -> None:
    p = decode_logs(encode_notice("j", 0, "n", 1.0, "progress",
                                  {"rank": 2, "step": 9, "step_time_s": 0.5}, run_id="r"))
    assert p == Progress("j", 0, "n", 1.0, 2, 9, step_time_s=0.5, source="sdk", run_id="r")
    s = decode_logs(encode_notice("j", 0, "n", 1.0, "stage", {"stage": "eval"}))
    assert s == Stage("j", 0, "n", 1.0, None, "eval", True, None, source="sdk")


BAD_LOGS = [
    ("rank", {**LINES, "rank": "x"}),  # issue 8 case 6
    ("attempt", {**LINES, "attempt": 999999}),  # issue 8 case 7
    ("attempt", {**LINES, "attempt": -1}),
    ("attempt", {**LINES, "attempt": True}),
    ("job", {**LINES, "job": ""}),
    ("job", {**LINES, "job": "a" * (MAX_ID_CHARS + 1)}),
    ("control", {**LINES, "job": "prod\n[faultwatch] decision FAIL job=prod"}),
    ("node", {**LINES, "node": 5}),
    ("run_id", {**LINES, "run_id": ["r"]}),
    ("lines", {**LINES, "lines": "abc"}),
    ("line", {**LINES, "lines": [["e", 0, "1.0", "x", 0, 0]]}),
    ("line", {**LINES, "lines": [["e", 0, 1.0, 7, 0, 0]]}),
    ("line", {**LINES, "lines": [["e", 0, None, "x", 0, 0]]}),
    ("ts", {"t": "hb", "job": "j", "attempt": 0, "node": "n", "ts": -5, "alive": True}),
    ("alive", {"t": "hb", "job": "j", "attempt": 0, "node": "n", "ts": 1, "alive": "yes"}),
    ("exit_code", {"t": "exit", "job": "j", "attempt": 0, "node": "n", "ts": 1,
                   "exit_code": 10**9}),
    ("signal", {"t": "exit", "job": "j", "attempt": 0, "node": "n", "ts": 1, "exit_code": 1,
                "signal": "KILL"}),
    ("world_size", {"t": "start", "job": "j", "attempt": 0, "node": "n", "ts": 1,
                    "world_size": 0}),
    ("scheduler", {"t": "start", "job": "j", "attempt": 0, "node": "n", "ts": 1,
                   "scheduler": ["slurm"]}),
    ("step", {"t": "note", "job": "j", "attempt": 0, "node": "n", "ts": 1, "kind": "progress",
              "data": {"step": "7"}}),
    ("hang_window_s", {"t": "note", "job": "j", "attempt": 0, "node": "n", "ts": 1,
                       "kind": "stage", "data": {"stage": "s", "hang_window_s": -1}}),
    ("data", {"t": "note", "job": "j", "attempt": 0, "node": "n", "ts": 1, "kind": "notify",
              "data": [1]}),
    ("type", {"t": "lnes"}),
]


@pytest.mark.parametrize(("what", "d"), BAD_LOGS, ids=[f"{w}-{i}" for i, (w, _) in
                                                         enumerate(BAD_LOGS)])
def test_malformed_logs_records_are_decode_errors_naming_the_field(what: str, d: dict) -> None:
    with pytest.raises(DecodeError) as e:
        decode_logs(rec(**d))
    assert what in str(e.value) or what in ("line", "control")


def test_non_finite_numbers_never_get_in() -> None:
    for v in (b'{"v":1,"t":"hb","job":"j","attempt":0,"node":"n","ts":1e999,"alive":true}',
              b'{"v":1,"t":"hb","job":"j","attempt":0,"node":"n","ts":NaN,"alive":true}',
              b"\xff\xfe", b"[]", b"", None):
        with pytest.raises(DecodeError):
            decode_logs(v)
    with pytest.raises(DecodeError, match="finite"):  # a dict built in-process
        signal_of({"t": "prog", "job": "j", "attempt": 0, "node": "n", "ts": 1.0, "step": 1,
                   "step_time_s": float("nan")})
    with pytest.raises(DecodeError, match="finite"):
        signal_of({"t": "note", "job": "j", "attempt": 0, "node": "n", "ts": 1.0,
                   "kind": "notify", "data": {"x": [float("inf")]}})


def test_signals_decode_bundles_and_ticks_and_reject_bad_elements() -> None:
    assert decode_signals(encode_tick(12.5)) == Tick(12.5)
    ok = {"t": "exit", "job": "j", "attempt": 0, "node": "n", "ts": 1.0, "exit_code": 1}
    assert decode_signals(rec(t="bundle", job="j", sigs=[ok])) == [Exit("j", 0, "n", 1.0, 1)]
    for bad in ([ok, 5], [{**ok, "job": "other"}], [{**ok, "t": "nope"}],
                [{"t": "hit", "job": "j", "attempt": 0, "node": "n", "m": {"rule": "r"}}],
                [{"t": "out", "job": "j", "attempt": 0, "node": "n", "ts": 1, "count": 1,
                  "ranks": [[0]], "tail": []}]):
        with pytest.raises(DecodeError):
            decode_signals(rec(t="bundle", job="j", sigs=bad))
    with pytest.raises(DecodeError):
        decode_signals(rec(t="tick", now="soon"))


def test_decisions_round_trip_and_malformed_ones_are_decode_errors() -> None:
    assert decode_decision(encode_decision(DEC)) == DEC
    good = decision_to_dict(DEC)
    for path, value in [(("targets", "nodes"), [["n0"]]),  # issue 8 case 8
                        (("id",), ["x"]),
                        (("targets", "ranks"), ["3"]),
                        (("action",), "reboot"),
                        (("attempt",), 10**6),
                        (("reason",), "hang"),
                        (("reason", "message"), 5),
                        (("evidence",), []),
                        (("scheduler",), {"bad\nkey": 1}),
                        (("run_id",), 5),
                        (("ts",), None)]:
        d = orjson.loads(orjson.dumps(good))
        target = d
        for k in path[:-1]:
            target = target[k]
        target[path[-1]] = value
        with pytest.raises(DecodeError, match=path[-1] if path[-1] != "reason" else "reason"):
            decode_decision(orjson.dumps(d))
    with pytest.raises(DecodeError):
        decode_decision(orjson.dumps({**good, "v": 2}))


def test_a_backlog_batch_is_split_into_bundles_under_the_record_limit() -> None:
    """Issue 8 case 1: 2,000 records of 10 long lines for one job in one matcher batch made
    one bundle past the broker's 1 MB limit. encode_bundles splits in order; a signal that
    cannot fit a record on its own is refused (the matcher caps texts first: cap_signal)."""
    from faultwatch.core.events import Hit, Match, Output, TailLine
    from faultwatch.wire import MAX_RECORD_BYTES, encode_bundle, encode_bundles, signal_dict

    sigs = []
    for i in range(2000):
        tail = tuple(TailLine(0, float(i), "x" * 500) for _ in range(8))
        sigs.append(Output("j", 0, "n0", float(i), 10, ((0, float(i)),), tail, run_id="r"))
    assert len(encode_bundle("j", sigs)) > 1_000_000  # what the matcher made before
    elements = [orjson.dumps(signal_dict(s)) for s in sigs]
    records = encode_bundles("j", elements)
    assert len(records) > 1 and all(len(r) <= MAX_RECORD_BYTES for r in records)
    back = [s for r in records for s in decode_signals(r)]  # type: ignore[union-attr]
    assert back == sigs  # every signal, in order
    assert encode_bundles("j", elements[:3]) == [encode_bundle("j", sigs[:3])]  # same bytes
    huge = Hit("j", 0, "n0", Match("r", "fatal", False, 1.0, "y" * 65536,
                                   context=tuple("z" * 65536 for _ in range(60))))
    with pytest.raises(ValueError, match="limit"):
        encode_bundles("j", [orjson.dumps(signal_dict(huge))])
