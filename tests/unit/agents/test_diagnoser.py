"""The agent's side of hang diagnosis: what it puts in the child's environment."""

from __future__ import annotations

from faultwatch.agents.dumps import FR_BUFFER_ENTRIES, Diagnoser
from faultwatch.sdk.rank_dumps import DIR_ENV


def test_env_enables_the_flight_recorder_unless_the_user_set_it() -> None:
    d = Diagnoser(lambda k, v: None, lambda *a, **k: None, {})
    try:
        assert d.env["TORCH_FR_BUFFER_SIZE"] == FR_BUFFER_ENTRIES
        assert d.env["TORCH_NCCL_TRACE_BUFFER_SIZE"] == FR_BUFFER_ENTRIES
        assert d.dir.is_dir() and d.env[DIR_ENV] == str(d.dir)
    finally:
        d.close()
    assert not d.dir.exists()
    mine = Diagnoser(lambda k, v: None, lambda *a, **k: None, {"TORCH_FR_BUFFER_SIZE": "50"})
    try:
        assert "TORCH_FR_BUFFER_SIZE" not in mine.env  # the user's own setting wins
        assert mine.env["TORCH_NCCL_TRACE_BUFFER_SIZE"] == FR_BUFFER_ENTRIES
    finally:
        mine.close()
