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


# nvidia-smi --query-gpu=... --format=csv,noheader,nounits, the format NVIDIA documents
SMI_OK = ("0, NVIDIA A100-SXM4-40GB, GPU-aaaa, 00000000:3B:00.0, 535.104.05, 0, No, No, No\n"
          "1, NVIDIA A100-SXM4-40GB, GPU-bbbb, 00000000:3C:00.0, 535.104.05, [N/A], No, No, "
          "No\n")
TORCH_GPU = {"python": "3.11.9", "torch": "2.3.0", "cuda": "12.1", "cuda_available": True,
             "gpu_count": 2, "gpus": ["NVIDIA A100-SXM4-40GB"] * 2, "nccl": "2.20.5"}
TORCH_CPU = {"python": "3.11.9", "torch": "2.3.0", "cuda": None, "cuda_available": False,
             "gpu_count": 0, "gpus": []}


def _by(checks: list[dict]) -> dict[str, dict]:  # type: ignore[type-arg]
    return {c["name"]: c for c in checks}


def test_cpu_node_reports_not_applicable_instead_of_ok() -> None:
    from faultwatch.agents.bootcheck import version_checks

    by = _by(version_checks(TORCH_CPU, "", None, "", None))
    assert {k: by[k]["status"] for k in ("cuda", "nccl", "gpus", "driver")} == \
        dict.fromkeys(("cuda", "nccl", "gpus", "driver"), "not_applicable")
    assert by["torch"]["status"] == "pass"
    # expecting 0 GPUs is a real check that passes; expecting 1 fails
    assert _by(version_checks(TORCH_CPU, "", None, "", 0))["gpus"]["status"] == "pass"
    one = _by(version_checks(TORCH_CPU, "", None, "", 1))
    assert one["gpus"]["status"] == "fail" and one["cuda"]["status"] == "fail"


def test_gpu_node_checks_counts_health_driver_and_nccl() -> None:
    from faultwatch.agents.bootcheck import parse_nvidia_smi, version_checks

    smi = parse_nvidia_smi(SMI_OK)
    by = _by(version_checks(TORCH_GPU, "", smi, "", 2))
    assert all(c["status"] == "pass" for c in by.values()), by
    assert by["driver"]["value"] == "535.104.05"
    # torch sees one GPU fewer than NVML: a GPU fell off / is hidden
    lost = _by(version_checks({**TORCH_GPU, "gpu_count": 1}, "", smi, "", None))
    assert lost["gpus"]["status"] == "fail" and "nvidia-smi lists 2" in lost["gpus"]["detail"]
    # uncorrectable ECC errors and a failed row remap
    bad = parse_nvidia_smi(SMI_OK.replace("535.104.05, 0, No, No, No",
                                          "535.104.05, 3, No, Yes, Yes"))
    sick = _by(version_checks(TORCH_GPU, "", bad, "", 2))["gpus"]
    assert sick["status"] == "fail"
    assert "3 uncorrectable ECC" in sick["detail"] and "row remapping failed" in sick["detail"]
    # NVML cannot talk to the driver (e.g. driver/library version mismatch)
    err = "nvidia-smi exited 18: Failed to initialize NVML: Driver/library version mismatch"
    broken = _by(version_checks(TORCH_CPU, "", None, err, None))
    assert broken["driver"]["status"] == "fail" and broken["cuda"]["status"] == "fail"
    assert broken["gpus"]["status"] == "fail"
    # CUDA available but NCCL unusable
    no_nccl = _by(version_checks({**TORCH_GPU, "nccl": None, "nccl_error": "x"}, "", smi, "",
                                 2))
    assert no_nccl["nccl"]["status"] == "fail"


def test_allreduce_result_is_judged_for_correctness_and_bandwidth() -> None:
    from faultwatch.agents.bootcheck import allreduce_check

    good = {"ok": True, "busbw_gb_s": 4.0}
    assert allreduce_check(good, "", 0.0)["status"] == "pass"
    assert allreduce_check(good, "", 3.0)["status"] == "pass"
    slow = allreduce_check(good, "", 10.0)
    assert slow["status"] == "fail" and "below 10.0" in slow["detail"]
    assert allreduce_check({"ok": False, "error": "wrong sum"}, "", 0)["detail"] == "wrong sum"
    assert allreduce_check(None, "timed out after 60s", 0)["status"] == "fail"


def test_versions_are_probed_with_the_training_commands_interpreter(tmp_path) -> None:  # type: ignore[no-untyped-def]
    import os
    import sys

    from faultwatch.agents.bootcheck import training_python

    assert training_python([sys.executable, "train.py"]) == sys.executable
    venv_py = tmp_path / "venv" / "bin" / "python3.11"
    venv_py.parent.mkdir(parents=True)
    venv_py.write_text("")
    venv_py.chmod(0o755)
    script = tmp_path / "venv" / "bin" / "torchrun"
    script.write_text(f"#!{venv_py}\nimport sys\n")
    script.chmod(0o755)
    assert training_python([str(script), "--nproc-per-node", "2"]) == str(venv_py)
    env_script = tmp_path / "launch"
    env_script.write_text("#!/usr/bin/env python3\n")
    env_script.chmod(0o755)
    if os.access("/usr/bin/env", os.X_OK):
        import shutil

        assert training_python([str(env_script)]) == shutil.which("python3")
    shell = tmp_path / "run.sh"
    shell.write_text("#!/bin/bash\nexec python train.py\n")
    shell.chmod(0o755)
    assert training_python([str(shell)]) == sys.executable  # not knowable: ours
    assert training_python([]) == sys.executable
    assert training_python(["no-such-command-xyz"]) == sys.executable


def test_torch_not_installed_is_not_applicable_but_a_broken_torch_fails() -> None:
    from faultwatch.agents.bootcheck import version_checks

    absent = version_checks({"python": "3.11.2", "torch": None,
                             "torch_error": "ModuleNotFoundError: No module named 'torch'"},
                            "", None, "", None)
    assert {c["name"]: c["status"] for c in absent}["torch"] == "not_applicable"
    broken = version_checks({"python": "3.11.2", "torch": None,
                             "torch_error": "OSError: libcudart.so.12: cannot open"},
                            "", None, "", None)
    assert {c["name"]: c["status"] for c in broken}["torch"] == "fail"
