"""Boot checks (seed 001): disk speed, Python/torch/CUDA/NCCL versions, GPUs, an all-reduce.

torch is only ever imported in subprocesses, so the agent itself stays torch-free."""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import sys
import time
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from faultwatch.agents.config import EXIT_BOOTCHECK_FAILED

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


def check(name: str, ok: bool, value: Any = None, detail: str = "") -> dict[str, Any]:
    return {"name": name, "ok": bool(ok), "value": value, "detail": detail}


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


async def versions(timeout_s: float, expect_gpus: int | None) -> list[dict[str, Any]]:
    d, err = await _run_json([sys.executable, "-c", _VERSIONS], timeout_s)
    if d is None:
        return [check("versions", False, None, err)]
    out = [check("python", True, d.get("python") or platform.python_version())]
    if d.get("torch") is None:
        out.append(check("torch", False, None, d.get("torch_error", "torch not importable")))
        return out
    out.append(check("torch", True, d["torch"]))
    out.append(check("cuda", True, d.get("cuda"),
                     "available" if d.get("cuda_available") else "not available (CPU)"))
    out.append(check("nccl", True, d.get("nccl"), d.get("nccl_error", "")))
    n = int(d.get("gpu_count") or 0)
    ok = expect_gpus is None or n == expect_gpus
    out.append(check("gpus", ok, {"count": n, "types": sorted(set(d.get("gpus") or []))},
                     "" if ok else f"expected {expect_gpus} GPUs, found {n}"))
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
    for name in ("FAULTWATCH_NODE_RANK", "NODE_RANK", "GROUP_RANK", "SLURM_NODEID"):
        v = env.get(name, "").strip()
        if v.isdigit():
            return int(v)
    return None


async def all_checks(paths: tuple[str, ...], min_mb_s: float, expect_gpus: int | None,
                     allreduce: bool, timeout_s: float, nnodes: int | None,
                     env: Mapping[str, str]) -> list[dict[str, Any]]:
    checks = [await asyncio.to_thread(disk_speed, p, DISK_TEST_BYTES, min_mb_s) for p in paths]
    checks += await versions(timeout_s, expect_gpus)
    if allreduce:
        argv = allreduce_argv(env, nnodes, node_rank_from_env(env), timeout_s)
        if argv is None:
            checks.append(check("allreduce", False, None, "a multi-node job needs MASTER_ADDR, "
                                "MASTER_PORT and a node rank (NODE_RANK, GROUP_RANK, "
                                "SLURM_NODEID or FAULTWATCH_NODE_RANK)"))
        else:
            d, err = await _run_json(argv, timeout_s, env)
            ok = bool(d and d.get("ok"))
            checks.append(check("allreduce", ok, d, err or ("" if ok else str(
                (d or {}).get("error", "failed")))))
    return checks


async def run_bootchecks(agent: Agent) -> bool:
    """Run the configured checks, log failures, ship a `bootcheck` note; True when all pass."""
    c = agent.cfg
    t0 = time.monotonic()
    checks = await all_checks(c.bootcheck_paths, c.bootcheck_min_mb_s, c.bootcheck_expect_gpus,
                              c.bootcheck_allreduce, c.bootcheck_timeout_s, c.nnodes,
                              agent.child_env())
    ok = all(x["ok"] for x in checks)
    for x in checks:
        if not x["ok"]:
            agent.log("bootcheck_failed", check=x["name"], detail=x["detail"][:300])
    agent.note("bootcheck", {"ok": ok, "checks": checks, "rank": c.rank,
                             "seconds": round(time.monotonic() - t0, 2)})
    agent.log("bootcheck", ok=ok, checks=len(checks), seconds=round(time.monotonic() - t0, 1))
    return ok


def bootcheck_main(a: argparse.Namespace) -> int:
    """`faultwatch agent bootcheck`: the same checks on demand (e.g. after a failure)."""
    from faultwatch.agents.cli import bootcheck_kw
    from faultwatch.agents.config import AgentConfig

    kw = bootcheck_kw(a)
    env = dict(os.environ)
    checks = asyncio.run(all_checks(kw["bootcheck_paths"], kw["bootcheck_min_mb_s"],
                                    kw["bootcheck_expect_gpus"], kw["bootcheck_allreduce"],
                                    kw["bootcheck_timeout_s"], a.nnodes, env))
    ok = all(x["ok"] for x in checks)
    print(json.dumps({"ok": ok, "checks": checks}, indent=2))
    if not a.no_ship:
        cfg = AgentConfig.from_env_defaults(
            bootstrap=a.bootstrap, job=a.job, node=a.node, cmd=("bootcheck",),
            topic_prefix=a.topic_prefix, attempt=a.attempt or 0,
            spool_dir=Path(a.spool_dir) / "bootcheck" if a.spool_dir else None,
            exit_flush_timeout_s=a.exit_flush_timeout_s)
        if a.spool_dir is None:
            cfg = AgentConfig(**{**cfg.__dict__, "spool_dir": cfg.spool_dir / "bootcheck"})
        from faultwatch.agents.oneshot import ship_notes

        shipped = ship_notes(cfg, [("bootcheck", {"ok": ok, "checks": checks,
                                                  "on_demand": True})])
        if not shipped:
            print("faultwatch agent bootcheck: the note is still spooled (broker unreachable)",
                  file=sys.stderr)
    return 0 if ok else EXIT_BOOTCHECK_FAILED
