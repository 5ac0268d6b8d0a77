"""Boot checks without Kafka: disk speed on a real directory, how the all-reduce is run."""

from __future__ import annotations

import sys
from pathlib import Path

from faultwatch.agents.bootcheck import allreduce_argv, disk_speed, node_rank_from_env


def test_disk_speed_writes_reads_and_cleans_up(tmp_path: Path) -> None:
    r = disk_speed(str(tmp_path), 2 << 20)
    assert r["ok"] and r["name"] == f"disk:{tmp_path}"
    assert r["value"]["write_mb_s"] > 0 and r["value"]["read_mb_s"] > 0
    assert list(tmp_path.iterdir()) == []
    assert not disk_speed(str(tmp_path), 1 << 20, min_mb_s=1e12)["ok"]  # too slow
    bad = disk_speed(str(tmp_path / "missing"), 1 << 20)
    assert not bad["ok"] and "FileNotFoundError" in bad["detail"]


def test_allreduce_mode_from_env() -> None:
    tail = lambda argv: argv[5:]  # noqa: E731 - after python -m module --timeout-s T
    one = allreduce_argv({}, None, None, 60)
    assert one is not None and one[:3] == [sys.executable, "-m",
                                           "faultwatch.agents.bootcheck_allreduce"]
    assert tail(one) == ["--local", "2"]
    torchrun = {"TORCHELASTIC_RUN_ID": "x", "MASTER_ADDR": "h", "RANK": "3"}
    assert tail(allreduce_argv(torchrun, 4, None, 60) or []) == ["--torchrun"]
    multi = allreduce_argv({"MASTER_ADDR": "h0", "MASTER_PORT": "29500"}, 4, 2, 60)
    assert tail(multi or []) == ["--rank", "2", "--world-size", "4", "--master", "h0:29501"]
    assert allreduce_argv({}, 4, 2, 60) is None  # no rendezvous address: cannot check
    assert node_rank_from_env({"SLURM_NODEID": "5"}) == 5
    assert node_rank_from_env({"GROUP_RANK": "1", "SLURM_NODEID": "5"}) == 1
    assert node_rank_from_env({}) is None
