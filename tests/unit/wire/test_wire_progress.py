"""The `progs` signal (every rank's last step of a batch, issue 14) on the wire: round trips,
the single-rank `prog` form still decodes (a mixed-version processor pair), and malformed
marks are DecodeErrors naming the mark and the field."""

from __future__ import annotations

import orjson
import pytest

from faultwatch.core.events import Progress, ProgressBatch, RankStep
from faultwatch.errors import DecodeError
from faultwatch.wire import (
    MAX_LINES,
    MAX_STEP,
    decode_signals,
    encode_bundle,
    encode_signal,
    signal_dict,
    signal_of,
)

BATCH = ProgressBatch("j", 3, "n0", (RankStep(0, 10.5, 120, 5000), RankStep(7, 10.25, 119),
                                     RankStep(None, 11.0, -1, None)), run_id="r")
HEAD = {"t": "progs", "job": "j", "attempt": 3, "node": "n0", "run_id": "r"}


def rec(**d: object) -> bytes:
    return orjson.dumps({"v": 1, **d})


def test_a_batch_round_trips_alone_and_in_a_bundle() -> None:
    assert decode_signals(encode_signal(BATCH)) == [BATCH]
    p = Progress("j", 3, "n0", 12.0, 1, 121, 5000, 0.5, "sdk", "r")
    assert decode_signals(encode_bundle("j", [BATCH, p, BATCH])) == [BATCH, p, BATCH]
    no_run = ProgressBatch("j", 0, "n", (RankStep(2, 1.0, 5),))
    assert decode_signals(encode_signal(no_run)) == [no_run]
    # compact: the marks are rows, not objects
    assert signal_dict(BATCH)["marks"] == [(0, 10.5, 120, 5000), (7, 10.25, 119, None),
                                           (None, 11.0, -1, None)]


def test_the_single_rank_form_still_decodes_as_progress() -> None:
    """What an older matcher stage sends (and what SDK notes are): one rank per signal."""
    old = {"t": "prog", "job": "j", "attempt": 3, "node": "n0", "ts": 10.5, "rank": 0,
           "step": 120, "total": 5000, "src": "log", "run_id": "r"}
    assert decode_signals(rec(**old)) == [Progress("j", 3, "n0", 10.5, 0, 120, 5000,
                                                   run_id="r")]
    mixed = decode_signals(rec(t="bundle", job="j", sigs=[old, signal_dict(BATCH)]))
    assert mixed == [Progress("j", 3, "n0", 10.5, 0, 120, 5000, run_id="r"), BATCH]


BAD_MARKS = [
    ("marks", "must be a list", {"marks": {"0": [0, 1.0, 1, None]}}),
    ("marks", "must not be empty", {"marks": []}),
    ("", "missing field 'marks'", {}),
    ("marks[1]", "must be [rank, ts, step, total]", {"marks": [[0, 1.0, 1, None], 5]}),
    ("marks[0]", "must be [rank, ts, step, total]", {"marks": [[0, 1.0, 1]]}),
    ("marks[0]", "must be [rank, ts, step, total]", {"marks": [[0, 1.0, 1, None, 9]]}),
    ("marks[0].rank", "must be an integer", {"marks": [["3", 1.0, 1, None]]}),
    ("marks[0].rank", "out of range", {"marks": [[-1, 1.0, 1, None]]}),
    ("marks[2].ts", "must be a number", {"marks": [[0, 1.0, 1, None]] * 2
                                         + [[0, "1.0", 1, None]]}),
    ("marks[0].ts", "out of range", {"marks": [[0, -5.0, 1, None]]}),
    ("marks[0].step", "must be an integer", {"marks": [[0, 1.0, 1.5, None]]}),
    ("marks[0].step", "must be an integer", {"marks": [[0, 1.0, True, None]]}),
    ("marks[0].step", "out of range", {"marks": [[0, 1.0, MAX_STEP + 1, None]]}),
    ("marks[0].total", "out of range", {"marks": [[0, 1.0, 1, -2]]}),
    ("job", "must not be empty", {"job": "", "marks": [[0, 1.0, 1, None]]}),
    ("node", "contains a control character", {"node": "n\n0", "marks": [[0, 1.0, 1, None]]}),
]


@pytest.mark.parametrize(("field", "why", "d"), BAD_MARKS,
                         ids=[f"{f}-{i}" for i, (f, _, _) in enumerate(BAD_MARKS)])
def test_malformed_batches_are_decode_errors_naming_what_is_wrong(field: str, why: str,
                                                                  d: dict) -> None:
    with pytest.raises(DecodeError) as e:
        decode_signals(rec(**{**HEAD, **d}))
    msg = str(e.value)
    assert f"progs{'.' if field else ''}{field}: {why}" in msg, msg


def test_marks_off_the_usual_shape_still_decode_when_valid() -> None:
    """An integer time or a tuple row (a dict built in-process) takes the checked path."""
    got = signal_of({**HEAD, "marks": [[0, 5, 1, None], (None, 6.5, 2, 9)]})
    assert got == ProgressBatch("j", 3, "n0", (RankStep(0, 5.0, 1), RankStep(None, 6.5, 2, 9)),
                                "r")
    assert type(got.marks[0].ts) is float  # type: ignore[union-attr]


def test_a_non_finite_ts_and_an_oversized_batch_are_refused() -> None:
    with pytest.raises(DecodeError, match="not JSON"):  # orjson refuses NaN and 1e999
        decode_signals(b'{"v":1,"t":"progs","job":"j","attempt":0,"node":"n",'
                       b'"marks":[[0,NaN,1,null]]}')
    with pytest.raises(DecodeError, match=r"progs\.marks\[0\]\.ts: must be finite"):
        signal_of({**HEAD, "marks": [[0, float("inf"), 1, None]]})
    with pytest.raises(DecodeError, match=r"progs\.marks\[1\]\.ts: must be finite"):
        signal_of({**HEAD, "marks": [[0, 1.0, 1, None], [0, float("nan"), 1, None]]})
    with pytest.raises(DecodeError, match=f"more than {MAX_LINES} items"):
        decode_signals(rec(**HEAD, marks=[[0, 1.0, 1, None]] * (MAX_LINES + 1)))


def test_a_bad_batch_in_a_bundle_names_its_place_and_job() -> None:
    with pytest.raises(DecodeError, match="differs from the bundle's job"):
        decode_signals(rec(t="bundle", job="other", sigs=[signal_dict(BATCH)]))
    with pytest.raises(DecodeError, match=r"progs\.marks\[0\]\.step"):
        decode_signals(rec(t="bundle", job="j", sigs=[{**HEAD, "marks": [[0, 1.0, "7", 0]]}]))
