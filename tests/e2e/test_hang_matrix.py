"""The hang evaluation matrix on real torchrun jobs (tests/support/hang_matrix.py): healthy
silences outlasting the learned window (a slow checkpoint save, an upload to a slow object
store, evaluation without logging, a compile-like CPU burn, a slow dataset) end with no
action — each with its positive control, a notice that held the hang back during it — and
real hangs (a rank stuck before a collective, a rank in a Python deadlock while the other
waits, a stuck data-loader worker, every rank deadlocked) are decided with the right culprit,
before the ceiling. One run of five jobs side by side; `bench/hang_matrix.py` prints the
same matrix as a table."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest

from tests.support.hang_matrix import SCENARIOS, SETTINGS, TRAIN_BIN, run_matrix, table

# one run of the matrix: 5 torchrun jobs, 6-7 min on a loaded 2-core machine (torch start-up)
pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]


@pytest.fixture(scope="module")
def matrix(tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict[str, Any]]:
    if os.environ.get("FAULTWATCH_NO_TRAIN_ENV"):
        pytest.skip("FAULTWATCH_NO_TRAIN_ENV is set: no training-image env (.venv-train)")
    assert (TRAIN_BIN / "torchrun").exists(), "scripts/bootstrap.sh builds .venv-train"
    rows = run_matrix(Path(tmp_path_factory.mktemp("hang-matrix")))
    print("\n" + table(rows))
    return {r["scenario"]: r for r in rows}


def _explain(row: dict[str, Any]) -> str:
    return json.dumps({k: v for k, v in row.items() if k != "output_tail"}, indent=1) + \
        "\n" + str(row.get("output_tail", ""))[-2500:]


@pytest.mark.parametrize("name", [s.name for s in SCENARIOS if s.expected == "no action"])
def test_a_healthy_silence_gets_no_action(matrix: dict[str, dict[str, Any]], name: str) -> None:
    row = matrix[name]
    assert row["decision"] == "no action", _explain(row)
    assert row["held_notices"] >= 1, "the silence never outlasted the learned window: " \
                                     "the scenario proves nothing\n" + _explain(row)
    assert row["ok"], _explain(row)


@pytest.mark.parametrize("name", [s.name for s in SCENARIOS if s.expected == "hang"])
def test_a_real_hang_is_decided_with_its_culprit(matrix: dict[str, dict[str, Any]],
                                                 name: str) -> None:
    row = matrix[name]
    assert row["decision"] == "hang (fail)", _explain(row)
    assert row["culprit"] == row["expected_culprit"], _explain(row)
    assert row["seconds_after_stall"] < SETTINGS["hang_ceiling_s"], \
        "decided at the ceiling, not on evidence\n" + _explain(row)
