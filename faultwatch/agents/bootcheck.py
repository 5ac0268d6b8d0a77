"""Boot checks (seed 001): disk speed, Python/torch/CUDA/NCCL versions, GPUs, an all-reduce.

Every check has a `status`: "pass" or "fail" only after it really checked something, and
"not_applicable" when there is nothing to check here (no GPU on a CPU node); `ok` is
`status != "fail"`. torch is only ever imported in subprocesses, so the agent itself stays
torch-free."""

from __future__ import annotations

import asyncio
import json
import os
import platform
import re
import shutil
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from faultwatch import settings
from faultwatch.agents.config import EXIT_BOOTCHECK_FAILED, AgentConfig

if TYPE_CHECKING:
    from faultwatch.agents.agent import Agent

DISK_TEST_BYTES = 16 << 20
_CHUNK = 1 << 20

_VERSIONS = r"""
import json, sys
out = {"python": sys.version.split()[0]}
try:
    import torch
    out["torch"] = torch.__version__
    out["cuda"] = torch.version.cuda
    out["cuda_available"] = torch.cuda.is_available()
    out["gpu_count"] = torch.cuda.device_count() if out["cuda_available"] else 0
    out["gpus"] = [torch.cuda.get_device_name(i) for i in range(out["gpu_count"])]
    try:
        v = torch.cuda.nccl.version() if out["cuda_available"] else None
        out["nccl"] = ".".join(map(str, v)) if isinstance(v, tuple) else v
    except Exception as e:
        out["nccl"] = None
        out["nccl_error"] = str(e)
except Exception as e:
    out["torch"] = None
    out["torch_error"] = f"{type(e).__name__}: {e}"
print(json.dumps(out))
"""


PASS, FAIL, NOT_APPLICABLE = "pass", "fail", "not_applicable"
NVIDIA_SMI_FIELDS = ("index", "name", "uuid", "pci.bus_id", "driver_version",
                     "ecc.errors.uncorrected.volatile.total", "retired_pages.pending",
                     "remapped_rows.pending", "remapped_rows.failure")


def check(name: str, ok: bool, value: Any = None, detail: str = "",
          status: str | None = None) -> dict[str, Any]:
    st = status or (PASS if ok else FAIL)
    return {"name": name, "ok": st != FAIL, "status": st, "value": value, "detail": detail}


def not_applicable(name: str, detail: str) -> dict[str, Any]:
    return check(name, True, None, detail, status=NOT_APPLICABLE)


def parse_nvidia_smi(text: str) -> list[dict[str, Any]]:
    """`nvidia-smi --query-gpu=<NVIDIA_SMI_FIELDS> --format=csv,noheader,nounits` rows."""
    gpus = []
    for line in text.splitlines():
        cells = [c.strip() for c in line.split(",")]
        if len(cells) != len(NVIDIA_SMI_FIELDS):
            continue
        gpus.append(dict(zip(NVIDIA_SMI_FIELDS, cells, strict=True)))
    return gpus


def _count(v: str) -> int | None:
    """An nvidia-smi counter, or None for '[N/A]' / 'N/A' / '[Not Supported]'."""
    return int(v) if v.isdigit() else None


def gpu_health(gpus: list[dict[str, Any]]) -> list[str]:
    """Problems nvidia-smi reports per GPU: uncorrectable ECC errors, pending page
    retirement or row remapping, a failed row remap (the GPU needs a reset or service)."""
    out = []
    for g in gpus:
        where = f"GPU {g['index']} ({g['pci.bus_id']})"
        ecc = _count(g["ecc.errors.uncorrected.volatile.total"])
        if ecc:
            out.append(f"{where}: {ecc} uncorrectable ECC errors since boot")
        if g["retired_pages.pending"].lower() == "yes":
            out.append(f"{where}: page retirement pending (reset the GPU)")
        if g["remapped_rows.pending"].lower() == "yes":
            out.append(f"{where}: row remapping pending (reset the GPU)")
        if g["remapped_rows.failure"].lower() == "yes":
            out.append(f"{where}: row remapping failed (the GPU needs service)")
    return out


async def nvidia_smi(timeout_s: float) -> tuple[list[dict[str, Any]] | None, str]:
    """GPUs as NVML sees them through nvidia-smi: (rows, "") or (None, why not / error);
    (None, "") when nvidia-smi is not installed."""
    import shutil

    exe = shutil.which("nvidia-smi")
    if exe is None:
        return None, ""
    proc = await asyncio.create_subprocess_exec(
        exe, f"--query-gpu={','.join(NVIDIA_SMI_FIELDS)}", "--format=csv,noheader,nounits",
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    try:
        out, err = await asyncio.wait_for(proc.communicate(), timeout_s)
    except TimeoutError:
        proc.kill()
        await proc.wait()
        return None, f"nvidia-smi timed out after {timeout_s:g}s"
    text = out.decode(errors="replace")
    if proc.returncode != 0:
        msg = (text + err.decode(errors="replace")).strip()[-500:]
        return None, f"nvidia-smi exited {proc.returncode}: {msg}"
    return parse_nvidia_smi(text), ""


def disk_speed(path: str, nbytes: int = DISK_TEST_BYTES, min_mb_s: float = 0.0
               ) -> dict[str, Any]:
    """Write (fsync'ed) then read back a bounded temporary file under path; MB/s each way."""
    name = f"disk:{path}"
    f = Path(path) / f".faultwatch-bootcheck-{os.getpid()}"
    buf = os.urandom(_CHUNK)
    try:
        t0 = time.perf_counter()
        fd = os.open(f, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        try:
            for _ in range(max(1, nbytes // _CHUNK)):
                os.write(fd, buf)
            os.fsync(fd)
        finally:
            os.close(fd)
        write_s = time.perf_counter() - t0
        fd = os.open(f, os.O_RDONLY)
        try:
            if hasattr(os, "posix_fadvise"):  # read from the device, not the page cache
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            t0 = time.perf_counter()
            while os.read(fd, _CHUNK):
                pass
            read_s = time.perf_counter() - t0
        finally:
            os.close(fd)
    except OSError as e:
        return check(name, False, None, f"{type(e).__name__}: {e}")
    finally:
        try:
            f.unlink()
        except OSError:
            pass
    mb = max(1, nbytes // _CHUNK) * _CHUNK / 1e6
    value = {"write_mb_s": round(mb / write_s, 1), "read_mb_s": round(mb / read_s, 1),
             "bytes": int(mb * 1e6)}
    slow = min(value["write_mb_s"], value["read_mb_s"]) < min_mb_s
    return check(name, not slow, value, f"slower than {min_mb_s} MB/s" if slow else "")


async def _run_json(argv: list[str], timeout_s: float, env: Mapping[str, str] | None = None
                    ) -> tuple[dict[str, Any] | None, str]:
    proc = await asyncio.create_subprocess_exec(*argv, stdout=asyncio.subprocess.PIPE,
                                                stderr=asyncio.subprocess.PIPE,
                                                env=dict(env) if env is not None else None,
                                                start_new_session=True)
    try:
        out, err = await asyncio.wait_for(proc.communicate(), timeout_s)
    except TimeoutError:
        proc.kill()
        await proc.wait()
        return None, f"timed out after {timeout_s:g}s"
    for raw in reversed(out.decode(errors="replace").splitlines()):
        if raw.startswith("{"):
            try:
                return json.loads(raw), ""
            except json.JSONDecodeError:
                break
    return None, err.decode(errors="replace")[-1000:] or f"exit {proc.returncode}"


def _is_python(path: str) -> bool:
    return re.fullmatch(r"python[0-9.]*", os.path.basename(path)) is not None


def training_python(cmd: Sequence[str]) -> str:
    """The interpreter the training command runs under, whose Python/torch/CUDA/NCCL are the
    ones that matter: the command itself when it is a Python executable, else the interpreter
    of its `#!` line (torchrun, accelerate, deepspeed entry points; `#!/usr/bin/env python3`
    too), else this agent's own interpreter (a shell script, srun: said in the note)."""
    if not cmd:
        return sys.executable
    exe = shutil.which(cmd[0]) or cmd[0]
    if _is_python(exe) and os.access(exe, os.X_OK):
        return exe
    try:
        with open(exe, "rb") as fh:
            first = fh.readline(512)
    except OSError:
        return sys.executable
    if first.startswith(b"#!"):
        parts = first[2:].decode(errors="replace").split()
        cand = parts[0] if parts else ""
        if os.path.basename(cand) == "env" and len(parts) > 1:
            cand = shutil.which(parts[-1]) or ""
        if cand and _is_python(cand) and os.access(cand, os.X_OK):
            return cand
    return sys.executable


async def versions(timeout_s: float, expect_gpus: int | None,
                   python: str | None = None) -> list[dict[str, Any]]:
    """Versions as `python` (the training interpreter; default: this one) sees them, and
    the GPUs as nvidia-smi sees them."""
    exe = python or sys.executable
    (d, err), (smi, smi_err) = await asyncio.gather(
        _run_json([exe, "-c", _VERSIONS], timeout_s), nvidia_smi(timeout_s))
    out = version_checks(d, err, smi, smi_err, expect_gpus)
    for c in out:
        if c["name"] in ("python", "torch", "versions"):
            c["detail"] = (c["detail"] + f" [{exe}]").strip()
    return out


def version_checks(d: dict[str, Any] | None, err: str, smi: list[dict[str, Any]] | None,
                   smi_err: str, expect_gpus: int | None) -> list[dict[str, Any]]:
    """Judge what torch (in a subprocess) and nvidia-smi reported. Pure, for tests."""
    if d is None:
        return [check("versions", False, None, err)]
    out = [check("python", True, d.get("python") or platform.python_version())]
    if d.get("torch") is None:
        err = str(d.get("torch_error", "torch not importable"))
        if err.startswith("ModuleNotFoundError"):  # a job that does not use torch: nothing
            out.append(not_applicable("torch", err))  # to check (nodes are still compared)
        else:  # installed but broken (a CUDA library missing...): this node is wrong
            out.append(check("torch", False, None, err))
        return out
    out.append(check("torch", True, d["torch"]))
    cuda_ok = bool(d.get("cuda_available"))
    smi_count = len(smi) if smi is not None else None
    gpus_expected = bool(expect_gpus) or bool(smi_count) or bool(smi_err)
    if smi is not None:
        drivers = sorted({g["driver_version"] for g in smi})
        out.append(check("driver", len(drivers) <= 1, drivers[0] if len(drivers) == 1 else
                         drivers, "" if len(drivers) <= 1 else "GPUs report different drivers"))
    elif smi_err:
        out.append(check("driver", False, None, smi_err))
    else:
        out.append(not_applicable("driver", "no nvidia-smi on this node"))
    if cuda_ok:
        out.append(check("cuda", True, d.get("cuda"), "available"))
        nccl = d.get("nccl")
        out.append(check("nccl", bool(nccl), nccl, d.get("nccl_error", "") if not nccl else ""))
    elif gpus_expected:
        out.append(check("cuda", False, d.get("cuda"), "GPUs expected or present but torch "
                                                        "cannot use CUDA"))
        out.append(not_applicable("nccl", "CUDA unavailable"))
    else:
        out.append(not_applicable("cuda", "no GPU on this node (CPU)"))
        out.append(not_applicable("nccl", "no GPU on this node (CPU)"))
    n = int(d.get("gpu_count") or 0)
    value = {"count": n, "types": sorted(set(d.get("gpus") or [])), "nvidia_smi": smi_count}
    problems = []
    if expect_gpus is not None and n != expect_gpus:
        problems.append(f"expected {expect_gpus} GPUs, torch sees {n}")
    if smi_count is not None and cuda_ok and smi_count != n:
        problems.append(f"nvidia-smi lists {smi_count} GPUs, torch sees {n}")
    if smi is not None:
        problems += gpu_health(smi)
    if smi_err:
        problems.append(smi_err)
    if problems:
        out.append(check("gpus", False, value, "; ".join(problems)))
    elif expect_gpus is None and not n and smi_count is None:
        out.append(not_applicable("gpus", "no GPU on this node and none expected"))
    else:
        out.append(check("gpus", True, value))
    return out


def allreduce_argv(env: Mapping[str, str], nnodes: int | None, node_rank: int | None,
                   timeout_s: float) -> list[str] | None:
    """How to run the all-reduce worker here; None when the job's peers cannot be found."""
    base = [sys.executable, "-m", "faultwatch.agents.bootcheck_allreduce", "--timeout-s",
            str(max(5.0, timeout_s - 5))]
    if env.get("TORCHELASTIC_RUN_ID") and env.get("MASTER_ADDR") and env.get("RANK"):
        return [*base, "--torchrun"]  # rank mode: every rank joins through torchrun's store
    if not nnodes or nnodes <= 1:
        return [*base, "--local", "2"]
    addr, port = env.get("MASTER_ADDR"), env.get("MASTER_PORT")
    if node_rank is None or not addr or not port:
        return None
    # one port above the job's own rendezvous port: node rank 0 hosts the check's store
    return [*base, "--rank", str(node_rank), "--world-size", str(nnodes), "--master",
            f"{addr}:{int(port) + 1}"]


def node_rank_from_env(env: Mapping[str, str]) -> int | None:
    for name in (settings.NODE_RANK.name, "NODE_RANK", "GROUP_RANK", "SLURM_NODEID"):
        v = env.get(name, "").strip()
        if v.isdigit():
            return int(v)
    return None


def allreduce_check(d: dict[str, Any] | None, err: str, min_busbw_gb_s: float
                    ) -> dict[str, Any]:
    """The all-reduce result: the sum must be right on every rank, and the bus bandwidth
    at least `min_busbw_gb_s` (0: not judged, only measured)."""
    if d is None or not d.get("ok"):
        return check("allreduce", False, d, err or str((d or {}).get("error", "failed")))
    busbw = d.get("busbw_gb_s")
    if min_busbw_gb_s > 0 and isinstance(busbw, (int, float)) and busbw < min_busbw_gb_s:
        return check("allreduce", False, d, f"bus bandwidth {busbw} GB/s below "
                                            f"{min_busbw_gb_s} GB/s")
    return check("allreduce", True, d)


async def all_checks(paths: tuple[str, ...], min_mb_s: float, expect_gpus: int | None,
                     allreduce: bool, timeout_s: float, nnodes: int | None,
                     env: Mapping[str, str], min_busbw_gb_s: float = 0.0,
                     python: str | None = None) -> list[dict[str, Any]]:
    checks = [await asyncio.to_thread(disk_speed, p, DISK_TEST_BYTES, min_mb_s) for p in paths]
    checks += await versions(timeout_s, expect_gpus, python)
    if allreduce:
        argv = allreduce_argv(env, nnodes, node_rank_from_env(env), timeout_s)
        if argv is None:
            checks.append(check("allreduce", False, None, "a multi-node job needs MASTER_ADDR, "
                                "MASTER_PORT and a node rank (NODE_RANK, GROUP_RANK, "
                                f"SLURM_NODEID or {settings.NODE_RANK})"))
        else:
            d, err = await _run_json(argv, timeout_s, env)
            # "node": among this node's processes (its failure blames it); "job": across
            # the job's ranks (a failure names no node: faultwatch/registry/checks.py)
            checks.append({**allreduce_check(d, err, min_busbw_gb_s),
                           "scope": "node" if "--local" in argv else "job"})
    else:
        checks.append(not_applicable("allreduce", "disabled (--no-bootcheck-allreduce)"))
    return checks


async def run_bootchecks(agent: Agent, when: str = "start") -> bool:
    """Run the configured checks, log failures, ship a `bootcheck` note; True when all pass.
    `when`: "start" (first launch) or "restart" (before relaunching after a failed attempt:
    seed 001's troubleshooting)."""
    return (await bootchecks(agent, when))[0]


async def bootchecks(agent: Agent, when: str = "start"
                     ) -> tuple[bool, list[dict[str, Any]]]:
    """run_bootchecks with the checks themselves. `when` "spare": a waiting hot spare's
    checks, whose all-reduce runs among its own processes (the job's ranks are training)."""
    c = agent.cfg
    t0 = time.monotonic()
    env = agent.child_env()
    python = training_python(c.cmd)
    checks = await all_checks(c.bootcheck_paths, c.bootcheck_min_mb_s, c.bootcheck_expect_gpus,
                              c.bootcheck_allreduce, c.bootcheck_timeout_s,
                              None if when == "spare" else c.nnodes, env,
                              float(getattr(c, "bootcheck_min_busbw_gb_s", 0.0) or 0.0),
                              python)
    ok = all(x["status"] != FAIL for x in checks)
    for x in checks:
        if not x["ok"]:
            agent.log("bootcheck_failed", check=x["name"], detail=x["detail"][:300], when=when)
    agent.note("bootcheck", {"ok": ok, "checks": checks, "rank": c.rank,
                             "node_rank": node_rank_from_env(env), "when": when,
                             "python": python, "seconds": round(time.monotonic() - t0, 2)})
    agent.log("bootcheck", ok=ok, checks=len(checks), when=when,
              seconds=round(time.monotonic() - t0, 1))
    return ok, checks


def bootcheck_now(paths: Sequence[str], min_mb_s: float, expect_gpus: int | None,
                  allreduce: bool, timeout_s: float, nnodes: int | None,
                  ship: AgentConfig | None) -> int:
    """`faultwatch agent bootcheck`: the same checks on demand (e.g. after a failure), printed
    as JSON and, with a `ship` configuration, shipped as a bootcheck note."""
    env = dict(os.environ)
    checks = asyncio.run(all_checks(tuple(paths), min_mb_s, expect_gpus, allreduce, timeout_s,
                                    nnodes, env))
    ok = all(x["status"] != FAIL for x in checks)
    print(json.dumps({"ok": ok, "checks": checks}, indent=2))
    if ship is not None:
        from faultwatch.agents.oneshot import ship_notes

        shipped = ship_notes(ship, [("bootcheck", {"ok": ok, "checks": checks,
                                                   "on_demand": True})])
        if not shipped:
            print("faultwatch agent bootcheck: the note is still spooled (broker unreachable)",
                  file=sys.stderr)
    return 0 if ok else EXIT_BOOTCHECK_FAILED
