"""Boot check worker: an all-reduce across the job's nodes (or 2 local processes); bandwidth.

Run as `python -m faultwatch.agents.bootcheck_allreduce`; prints one JSON object. The agent
never imports torch itself: this module is only ever run in a subprocess.

Modes: --local N runs N processes on this host (a 1-node job); otherwise --rank R
--world-size W --master HOST:PORT joins the other nodes' workers (node rank 0 hosts the
store). Under torchrun (rank mode) the store of torchrun's agent is used with a key prefix.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import sys
import time
from datetime import timedelta
from typing import Any


def _measure(rank: int, world: int, store: Any, size_mb: float, iters: int,
             timeout_s: float) -> dict[str, Any]:
    import torch
    import torch.distributed as dist

    backend = "nccl" if torch.cuda.is_available() else "gloo"
    device = "cpu"
    if backend == "nccl":
        local = int(os.environ.get("LOCAL_RANK", rank % max(1, torch.cuda.device_count())))
        torch.cuda.set_device(local)
        device = f"cuda:{local}"
    dist.init_process_group(backend, store=store, rank=rank, world_size=world,
                            timeout=timedelta(seconds=timeout_s))
    try:
        n = max(1, int(size_mb * (1 << 20) / 4))
        # each rank contributes rank+1: a rank sending wrong data (or none) changes the sum
        x = torch.full((n,), float(rank + 1), dtype=torch.float32, device=device)
        dist.all_reduce(x)  # also the warm-up (connections, buffers)
        expected = world * (world + 1) / 2
        ok = bool(torch.all(x == expected).item())
        if backend == "nccl":
            torch.cuda.synchronize()
        dist.barrier()
        t0 = time.perf_counter()
        for _ in range(iters):
            dist.all_reduce(x)
        if backend == "nccl":
            torch.cuda.synchronize()
        dt = (time.perf_counter() - t0) / iters
        nbytes = n * 4
        algbw = nbytes / dt / 1e9
        return {"ok": ok, "backend": backend, "world_size": world, "rank": rank,
                "size_mb": round(nbytes / (1 << 20), 2), "seconds_per_op": round(dt, 6),
                "algbw_gb_s": round(algbw, 3),
                "busbw_gb_s": round(algbw * 2 * (world - 1) / world, 3) if world > 1 else None}
    finally:
        dist.destroy_process_group()


def _run_local(n: int, a: argparse.Namespace) -> int:
    """N workers of this module on 127.0.0.1 (subprocesses: this one never imports torch)."""
    import subprocess

    master = f"127.0.0.1:{_free_port()}"
    env = dict(os.environ, OMP_NUM_THREADS=os.environ.get("OMP_NUM_THREADS", "1"))
    base = [sys.executable, "-m", "faultwatch.agents.bootcheck_allreduce", "--world-size",
            str(n), "--master", master, "--size-mb", str(a.size_mb), "--iters", str(a.iters),
            "--timeout-s", str(a.timeout_s)]
    procs = [subprocess.Popen([*base, "--rank", str(r)], env=env, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True) for r in range(n)]
    outs = [p.communicate() for p in procs]
    first = outs[0][0].strip().splitlines()
    if procs[0].returncode == 0 and first:
        print(first[-1], flush=True)
        return 0
    errs = "; ".join((o[0].strip() or o[1].strip()[-500:]) for o in outs)
    print(json.dumps({"ok": False, "error": errs[-2000:] or "workers failed"}), flush=True)
    return 1


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, allow_abbrev=False)
    ap.add_argument("--local", type=int, default=0, help="N processes on this host")
    ap.add_argument("--rank", type=int, default=None)
    ap.add_argument("--world-size", type=int, default=None)
    ap.add_argument("--master", default=None, help="HOST:PORT of node rank 0's store")
    ap.add_argument("--torchrun", action="store_true",
                    help="use torchrun's env (MASTER_ADDR/PORT, RANK, WORLD_SIZE) and store")
    ap.add_argument("--prefix", default="faultwatch-bootcheck", help="store key prefix")
    ap.add_argument("--size-mb", type=float, default=16.0)
    ap.add_argument("--iters", type=int, default=5)
    ap.add_argument("--timeout-s", type=float, default=60.0)
    a = ap.parse_args(argv)
    try:
        if a.local:
            return _run_local(a.local, a)
        import torch.distributed as dist

        if a.torchrun:
            rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
            host, port = os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"])
            base = dist.TCPStore(host, port, world, False, timeout=timedelta(seconds=a.timeout_s))
        else:
            if a.rank is None or not a.world_size or not a.master:
                ap.error("--rank, --world-size and --master are needed without --local")
            rank, world = a.rank, a.world_size
            host, _, p = a.master.rpartition(":")
            base = dist.TCPStore(host, int(p), world, rank == 0,
                                 timeout=timedelta(seconds=a.timeout_s))
        out = _measure(rank, world, dist.PrefixStore(a.prefix, base), a.size_mb, a.iters,
                       a.timeout_s)
        print(json.dumps(out), flush=True)
        return 0
    except Exception as e:  # noqa: BLE001 - the check's result is data, not a crash
        print(json.dumps({"ok": False, "error": f"{type(e).__name__}: {e}"[:2000]}), flush=True)
        return 1


if __name__ == "__main__":
    sys.exit(main())
