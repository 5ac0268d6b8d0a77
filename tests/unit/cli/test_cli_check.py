"""`faultwatch check` and the check at the start of `run` and `agent`, in process: the text and
JSON, the exit codes, --strict refusing a launch before the command starts, --no-check."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from faultwatch import cli
from faultwatch.errors import EXIT_CHAIN, EXIT_OK

TWO = ["torchrun", "--nnodes", "2", "--rdzv-backend", "c10d", "--rdzv-endpoint", "h:1",
       "t.py"]


@pytest.fixture(autouse=True)
def _no_scheduler(monkeypatch: pytest.MonkeyPatch) -> None:
    for var in ("SLURM_JOB_ID", "KUBERNETES_SERVICE_HOST", "FAULTWATCH_K8S_POD",
                "PET_RDZV_CONF", "FAULTWATCH_BOOTSTRAP"):
        monkeypatch.delenv(var, raising=False)


def test_check_prints_the_chain_and_exits_0_even_when_broken(
        capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["check", "--decision-wait-s", "2", "--", *TWO]) == EXIT_OK
    out = capsys.readouterr().out
    assert "rendezvous deadline (c10d)" in out and "default of torch 2.15.0" in out
    assert "BROKEN  decision-wait" in out and "fix: --decision-wait-s above" in out
    assert "flag --decision-wait-s" in out
    assert out.rstrip().endswith("result: 1 broken link (exit 9 with --strict)")


def test_strict_json_for_ci(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["check", "--json", "--strict", "--decision-wait-s", "2", "--",
                     *TWO]) == EXIT_CHAIN
    d = json.loads(capsys.readouterr().out)
    assert d["exit_code"] == EXIT_CHAIN and d["nests"] is False
    assert [lk["id"] for lk in d["links"] if lk["status"] == "broken"] == ["decision-wait"]
    # torch's 30 s worker shutdown inside the agent's 10 s term grace is a note; 5 s nests
    clean = ["check", "--json", "--strict", "--", *TWO[:-1], "--shutdown-timeout", "5", "t.py"]
    assert cli.main(clean) == EXIT_OK
    d = json.loads(capsys.readouterr().out)
    assert d["nests"] is True and d["exit_code"] == 0
    assert d["launch"]["torchrun"]["rdzv_backend"] == "c10d"


def test_policy_layers_name_their_source(tmp_path: Path,
                                         capsys: pytest.CaptureFixture[str]) -> None:
    rules = tmp_path / "mine.yaml"
    rules.write_text("version: 1\nrules: []\npolicy:\n  hang_ceiling_s: 900\n")
    assert cli.main(["check", "--rules", str(rules), "--stuck-stacks-s", "100", "--json",
                     "--", *TWO]) == EXIT_OK
    rows = {t["name"]: t for t in json.loads(capsys.readouterr().out)["timers"]}
    assert rows["hang window, first attempt"]["source"] == f"rules files {rules}"
    assert rows["hang window, first attempt"]["value_s"] == 900.0
    assert rows["every stack unchanged, no CPU"]["source"] == "flag --stuck-stacks-s"


def test_run_strict_refuses_a_broken_launch_before_the_command_starts(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    marker = tmp_path / "ran"
    cmd = [sys.executable, "-c", f"open({str(marker)!r}, 'w').close()"]
    # a decision wait shorter than the settle: every failure would end undecided
    assert cli.main(["run", "--strict", "--decision-wait-s", "1", "--", *cmd]) == EXIT_CHAIN
    err = capsys.readouterr().err
    assert "faultwatch run: timeout chain: 1 broken link" in err
    assert "decision-wait" in err and "not launching" in err
    assert not marker.exists()
    # without --strict the same run is warned once and runs
    assert cli.main(["run", "--decision-wait-s", "1", "--", *cmd]) == EXIT_OK
    assert marker.exists()
    assert capsys.readouterr().err.count("timeout chain:") == 1
    marker.unlink()
    assert cli.main(["run", "--no-check", "--strict", "--decision-wait-s", "1", "--",
                     *cmd]) == EXIT_OK
    assert marker.exists() and "timeout chain" not in capsys.readouterr().err


def test_a_clean_run_prints_nothing_about_the_chain(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    marker = tmp_path / "ran"
    cmd = [sys.executable, "-c", f"open({str(marker)!r}, 'w').close()"]
    assert cli.main(["run", "--strict", "--", *cmd]) == EXIT_OK
    assert marker.exists() and "timeout chain" not in capsys.readouterr().err
