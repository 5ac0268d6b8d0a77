"""The agent's side of hang diagnosis: what it puts in the child's environment."""

from __future__ import annotations

from faultwatch.agents.dumps import FR_BUFFER_ENTRIES, Diagnoser
from faultwatch.sdk.rank_dumps import DIR_ENV


def test_env_enables_the_flight_recorder_unless_the_user_set_it() -> None:
    d = Diagnoser(lambda k, v: None, lambda *a, **k: None, {})
    try:
        # this environment's torch (>= 2.8) reads the new name only: the old one would warn
        assert d.env["TORCH_FR_BUFFER_SIZE"] == FR_BUFFER_ENTRIES
        assert "TORCH_NCCL_TRACE_BUFFER_SIZE" not in d.env
        assert d.dir.is_dir() and d.env[DIR_ENV] == str(d.dir)
    finally:
        d.close()
    assert not d.dir.exists()
    mine = Diagnoser(lambda k, v: None, lambda *a, **k: None, {"TORCH_FR_BUFFER_SIZE": "50"})
    try:
        assert "TORCH_FR_BUFFER_SIZE" not in mine.env  # the user's own setting wins
        assert "TORCH_NCCL_TRACE_BUFFER_SIZE" not in mine.env
    finally:
        mine.close()


def test_the_flight_recorder_size_is_set_under_the_one_name_the_installed_torch_reads() -> None:
    from faultwatch.agents.dumps import fr_buffer_keys

    assert fr_buffer_keys("2.15.0+cu128") == ("TORCH_FR_BUFFER_SIZE",)  # no deprecation warning
    assert fr_buffer_keys("2.8.0") == ("TORCH_FR_BUFFER_SIZE",)
    assert fr_buffer_keys("2.7.1") == ("TORCH_NCCL_TRACE_BUFFER_SIZE",)  # the only name it reads
    assert fr_buffer_keys(None) == ("TORCH_FR_BUFFER_SIZE", "TORCH_NCCL_TRACE_BUFFER_SIZE")
    assert fr_buffer_keys("nightly") == ("TORCH_FR_BUFFER_SIZE", "TORCH_NCCL_TRACE_BUFFER_SIZE")
