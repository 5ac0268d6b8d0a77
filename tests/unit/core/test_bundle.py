"""Signals-topic bundles: one record per job per matcher batch; single records still decode."""

from __future__ import annotations

import orjson

from faultwatch.core.events import (
    Exit,
    Heartbeat,
    Hit,
    Match,
    Notice,
    Output,
    Progress,
    RunStart,
    Stage,
    TailLine,
)
from faultwatch.wire import (
    decode,
    decode_signals,
    encode_bundle,
    encode_signal,
    signal_dict,
    signal_of,
    signals_of_record,
)

SIGS = [
    RunStart("j", 1, "n0", 10.0, run_id="r", world_size=16, nnodes=2, local_ranks=(0, 1),
             cmd=("torchrun", "x.py"), run_source="slurm",
             scheduler={"kind": "slurm", "job_id": "12", "labels": {"team": "a"}}),
    Output("j", 1, "n0", 11.0, 3, rank_last_ts=((0, 11.0), (None, 10.5)),
           tail=(TailLine(0, 11.0, "step 1"), TailLine(None, 10.5, "hello"))),
    Hit("j", 1, "n0", Match("nccl", "retryable", False, 11.5, "NCCL error", rank=3,
                            seq=7, context=("Traceback", "  File x"))),
    Progress("j", 1, "n0", 12.0, 3, 100, total=1000, step_time_s=0.5, source="sdk"),
    Stage("j", 1, "n0", 12.5, None, "checkpoint", True, hang_window_s=None),
    Notice("j", 1, "n0", 13.0, "notify", {"message": "m"}),
    Heartbeat("j", 1, "n0", 14.0, True, 12.0, started_ts=10.0),
    Exit("j", 1, "n0", 15.0, exit_code=1, signal=None, run_id="r"),
    Progress("j", 1, "n0", 16.0, 3, 101, run_id="r"),
    Hit("j", 1, "n0", Match("x", "fatal", True, 16.5, "x"), run_id="r"),
]


def test_bundle_round_trips_every_signal_kind_in_order() -> None:
    d = decode(encode_bundle("j", SIGS))
    assert d["t"] == "bundle"
    assert signals_of_record(d) == SIGS == decode_signals(encode_bundle("j", SIGS))


def test_single_signal_records_still_decode() -> None:
    for s in SIGS:
        assert signals_of_record(decode(encode_signal(s))) == [s] == decode_signals(
            encode_signal(s))
        assert signal_of(orjson.loads(orjson.dumps({"v": 1, **signal_dict(s)}))) == s
