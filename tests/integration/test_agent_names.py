"""Job and node names reaching paths and terminals, with real agents and a real broker."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from faultwatch.kafka.broker import free_port
from tests.support.agents import agent_cmd

pytestmark = pytest.mark.kafka


def test_dot_dot_names_stay_in_the_spool_root_and_similar_names_do_not_share(
        kafka_bootstrap: str, topic_prefix: str, tmp_path: Path) -> None:
    root = tmp_path / "a" / "b" / "root"
    hold = "import time; print('up', flush=True); time.sleep(2)"
    # `x y` and `x_y` run at the same time: one shared spool dir would refuse the second.
    agents = [subprocess.Popen(agent_cmd(kafka_bootstrap, topic_prefix, root, job,
                                         sys.executable, "-c", hold),
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE)
              for job in ("x y", "x_y")]
    for p in agents:
        assert p.stdout is not None and p.stdout.readline() == b"up\n"
    argv = agent_cmd(kafka_bootstrap, topic_prefix, root, "..", sys.executable, "-c",
                     "print('dots')")
    argv[argv.index("--node") + 1] = ".."
    dots = subprocess.run(argv, capture_output=True, timeout=60)
    assert dots.returncode == 0, dots.stderr.decode()[-2000:]
    for p in agents:
        _, err = p.communicate(timeout=60)
        assert p.returncode == 0, err.decode()[-2000:]
    assert sorted(x.name for x in (tmp_path / "a" / "b").iterdir()) == ["root"]
    assert sorted(x.name for x in tmp_path.iterdir()) == ["a"]
    assert sorted(x.name for x in root.iterdir()) == ["%2E%2E", "x%20y", "x_y"]
    assert [x.name for x in (root / "%2E%2E").iterdir()] == ["%2E%2E"]


def test_a_control_character_in_a_job_name_is_refused_with_a_clear_error(
        kafka_bootstrap: str, topic_prefix: str, tmp_path: Path) -> None:
    res = subprocess.run(agent_cmd(kafka_bootstrap, topic_prefix, tmp_path,
                                   "x\n[faultwatch] decision FAIL job=prod", "true"),
                         capture_output=True, timeout=60)
    assert res.returncode != 0
    err = res.stderr.decode()
    assert "job" in err and "control character" in err and "Traceback" not in err, err


def test_spool_files_are_the_agent_users_alone(kafka_bootstrap: str, topic_prefix: str,
                                               tmp_path: Path) -> None:
    root = tmp_path / "spool"
    res = subprocess.run(agent_cmd(kafka_bootstrap, topic_prefix, root, "secret-job",
                                   sys.executable, "-c", "print('token=abc')"),
                         capture_output=True, timeout=60)
    assert res.returncode == 0, res.stderr.decode()[-2000:]
    # the same agent with no broker to deliver to: the lines stay in spool segments, the
    # files that hold the training job's output (a delivered segment is deleted at once)
    kept = tmp_path / "kept"
    res = subprocess.run(agent_cmd(f"127.0.0.1:{free_port()}", topic_prefix, kept, "secret-job",
                                   sys.executable, "-c", "print('token=abc')",
                                   extra=("--exit-flush-timeout-s", "1")),
                         capture_output=True, timeout=60)
    dirs = [d for r in (root, kept) for d in (r, *[p for p in r.rglob("*") if p.is_dir()])]
    files = [p for r in (root, kept) for p in r.rglob("*") if p.is_file()]
    segments = [p for p in files if p.suffix == ".seg" and b"token=abc" in p.read_bytes()]
    assert segments, (files, res.stderr.decode()[-2000:])  # positive control: spooled output
    assert {oct(d.stat().st_mode & 0o777) for d in dirs} == {"0o700"}, dirs
    assert {oct(f.stat().st_mode & 0o777) for f in files} == {"0o600"}, files
