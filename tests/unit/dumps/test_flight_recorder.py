"""Flight Recorder comparison on hand-made dumps shaped like torch 2.x gloo/NCCL dumps."""

from __future__ import annotations

from typing import Any

from faultwatch.dumps.flight_recorder import analyse
from tests.support.flight_recorder import dump, entry


def test_rank_behind_is_named_with_the_collective_the_others_wait_in() -> None:
    a = analyse({0: dump([entry(i) for i in range(1, 7)], 6, 5),
                 1: dump([entry(i) for i in range(1, 6)], 5, 4)})
    assert a.culprits == (1,)
    assert a.summary == ("rank 0 waits in all_reduce #6 (3\u00d74 float); rank 1 never entered "
                         "it (rank 1 last entered #5)")
    g = a.groups[0]
    assert (g.front, g.waiting, g.missing) == (6, (0,), (1,))


def test_positive_control_no_rank_missing() -> None:
    a = analyse({0: dump([entry(i) for i in range(1, 6)], 5, 5),
                 1: dump([entry(i) for i in range(1, 6)], 5, 4)})  # lazily discovered
    assert a.culprits == ()
    assert "no rank missing" in a.summary


def test_op_mismatch_at_the_same_sequence_number() -> None:
    a = analyse({0: dump([entry(1), entry(2, "all_reduce")], 2, 1, world=3),
                 1: dump([entry(1), entry(2, "broadcast")], 2, 1, world=3),
                 2: dump([entry(1), entry(2, "all_reduce")], 2, 1, world=3)})
    m = a.groups[0].mismatches
    assert m and m[0]["seq"] == 2 and m[0]["odd_ranks"] == [1]
    assert a.culprits == (1,)
    assert "broadcast #2" in a.summary


def test_size_and_dtype_mismatches_count_too() -> None:
    a = analyse({0: dump([entry(1, sizes=((8,),))], 1, world=3),
                 1: dump([entry(1, sizes=((4,),))], 1, world=3),
                 2: dump([entry(1, sizes=((8,),))], 1, world=3)})
    assert a.culprits == (1,)
    b = analyse({0: dump([entry(1, dtype="Float")], 1), 1: dump([entry(1, dtype="Half")], 1)})
    assert b.culprits == (0, 1)  # two ranks, no majority: both are suspects


def test_entries_alone_without_pg_status_and_named_config() -> None:
    a = analyse({0: dump([entry(i, backend="nccl") for i in range(1, 4)], cfg_name="0"),
                 1: dump([entry(i, backend="nccl") for i in range(1, 3)], cfg_name="0")})
    assert a.culprits == (1,)


def test_a_rank_without_a_dump_is_reported_not_blamed() -> None:
    a = analyse({0: dump([entry(1)], 1, 0)})
    assert a.culprits == ()
    assert a.problems and "rank(s) [1]" in a.problems[0]


def test_junk_never_raises() -> None:
    junk: dict[int, Any] = {0: {"entries": [None, 3, {"collective_seq_id": "x"}],
                                "pg_status": {"0": None}, "pg_config": {"": "bad"}},
                            1: {}}
    assert analyse(junk).culprits == ()
