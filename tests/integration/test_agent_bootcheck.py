"""Boot checks through the real CLI: a bootcheck note, a failed check aborting the launch."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from faultwatch.agents.config import EXIT_BOOTCHECK_FAILED
from tests.support.agents import agent_cmd, has_exit
from tests.support.kafka import consume

pytestmark = pytest.mark.kafka


def notes(recs: list[dict], kind: str) -> list[dict]:  # type: ignore[type-arg]
    return [r["data"] for r in recs if r["t"] == "note" and r["kind"] == kind]


@pytest.mark.slow
def test_bootcheck_with_allreduce_then_launch(kafka_bootstrap: str, topic_prefix: str,
                                              tmp_path: Path) -> None:
    res = subprocess.run(agent_cmd(kafka_bootstrap, topic_prefix, tmp_path / "sp", "bc",
                                   "echo", "launched",
                                   extra=("--no-follow-decisions", "--bootcheck",
                                          "--bootcheck-path", str(tmp_path),
                                          "--bootcheck-expect-gpus", "0",
                                          "--bootcheck-abort")),
                         capture_output=True, timeout=120)
    assert res.returncode == 0, res.stderr.decode()[-3000:]
    assert res.stdout == b"launched\n"
    recs = consume(kafka_bootstrap, f"{topic_prefix}logs", has_exit)
    (bc,) = notes(recs, "bootcheck")
    by = {c["name"]: c for c in bc["checks"]}
    assert bc["ok"] is True, bc
    assert {"python", "torch", "cuda", "nccl", "gpus", "allreduce", f"disk:{tmp_path}"} <= set(by)
    assert all(c["status"] in ("pass", "not_applicable") for c in bc["checks"]), bc
    # a CPU machine: nothing to check about CUDA/NCCL, said so instead of "ok"
    assert by["cuda"]["status"] == by["nccl"]["status"] == "not_applicable"
    assert by["gpus"]["status"] == "pass"  # expected 0 GPUs and found 0: a real check
    assert by["allreduce"]["status"] == "pass"
    assert by["allreduce"]["value"]["backend"] == "gloo"
    assert by["allreduce"]["value"]["world_size"] == 2
    assert by["allreduce"]["value"]["algbw_gb_s"] > 0
    assert by[f"disk:{tmp_path}"]["value"]["write_mb_s"] > 0
    kinds = [r["t"] if r["t"] != "note" else r["kind"] for r in recs]
    assert kinds.index("bootcheck") < kinds.index("start")  # checked before launching


def test_failed_check_aborts_the_launch_and_on_demand_subcommand(
        kafka_bootstrap: str, topic_prefix: str, tmp_path: Path) -> None:
    flags = ("--bootcheck-path", str(tmp_path / "no-such-mount"), "--no-bootcheck-allreduce")
    res = subprocess.run(agent_cmd(kafka_bootstrap, topic_prefix, tmp_path / "sp", "bc2",
                                   "echo", "launched",
                                   extra=("--no-follow-decisions", "--bootcheck",
                                          "--bootcheck-abort", *flags)),
                         capture_output=True, timeout=120)
    assert res.returncode == EXIT_BOOTCHECK_FAILED, res.stderr.decode()[-3000:]
    assert res.stdout == b""
    assert b"event=bootcheck_failed" in res.stderr and b"no-such-mount" in res.stderr
    # on demand, e.g. after a failure: `faultwatch agent bootcheck`
    sub = subprocess.run([sys.executable, "-m", "faultwatch", "agent", "bootcheck",
                          "--bootstrap", kafka_bootstrap, "--topic-prefix", topic_prefix,
                          "--job", "bc2", "--node", "n1", "--spool-dir", str(tmp_path / "sp"),
                          *flags], capture_output=True, timeout=120)
    assert sub.returncode == EXIT_BOOTCHECK_FAILED, sub.stderr.decode()[-3000:]
    assert b'"ok": false' in sub.stdout
    recs = consume(kafka_bootstrap, f"{topic_prefix}logs",
                   lambda rs: len(notes(rs, "bootcheck")) >= 2)
    bcs = notes(recs, "bootcheck")
    assert [b["ok"] for b in bcs] == [False, False]
    assert bcs[1].get("on_demand") is True
