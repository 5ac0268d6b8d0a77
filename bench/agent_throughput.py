"""Bench: agent lines/s into a real broker vs kcat -P, and child write stalls (up vs down)."""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

UNREACHABLE = "127.0.0.1:9"

# The child: writes n lines with one os.write each, timing every write (microseconds).
WRITER = r"""
import json, os, sys, time
n, size = int(sys.argv[1]), int(sys.argv[2])
pad = b"x" * max(0, size - 30)
lat = []
t0 = time.perf_counter()
for i in range(n):
    line = b"step %09d loss=0.1234 " % i + pad + b"\n"
    a = time.perf_counter()
    os.write(1, line)
    lat.append(time.perf_counter() - a)
total = time.perf_counter() - t0
lat.sort()
q = lambda p: lat[min(len(lat) - 1, int(p * len(lat)))] * 1e6
print(json.dumps({"lines": n, "child_s": round(total, 3), "p50_us": round(q(0.5), 1),
                  "p99_us": round(q(0.99), 1), "p999_us": round(q(0.999), 1),
                  "max_us": round(lat[-1] * 1e6, 1)}), file=sys.stderr)
"""


def agent_argv(bootstrap: str, prefix: str, spool: Path, cmd: list[str],
               flush_s: float) -> list[str]:
    return [sys.executable, "-m", "faultwatch.agents.cli", "agent", "--bootstrap", bootstrap,
            "--job", "bench", "--node", "n1", "--topic-prefix", prefix, "--spool-dir",
            str(spool), "--exit-flush-timeout-s", str(flush_s), "--", *cmd]


def last_json(stderr: bytes) -> dict[str, Any]:
    for raw in reversed(stderr.splitlines()):
        if raw.startswith(b"{"):
            return dict(json.loads(raw))
    raise RuntimeError(stderr.decode()[-2000:])


def agent_throughput(bootstrap: str, data: Path, n: int, tmp: Path) -> dict[str, Any]:
    prefix = f"bench{uuid.uuid4().hex[:6]}."
    t0 = time.perf_counter()
    res = subprocess.run(agent_argv(bootstrap, prefix, tmp / "sp1", ["cat", str(data)], 300),
                         stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    dt = time.perf_counter() - t0
    left = list((tmp / "sp1").rglob("*.seg"))
    return {"lines": n, "seconds": round(dt, 3), "lines_per_s": round(n / dt),
            "rc": res.returncode, "all_acked": not left}


def kcat_throughput(bootstrap: str, data: Path, n: int, codec: str) -> dict[str, Any]:
    kcat = shutil.which("kcat") or shutil.which("kafkacat")
    if kcat is None:
        return {"skipped": "kcat not installed (apt-get install -y kcat)"}
    topic = f"bench{uuid.uuid4().hex[:6]}.kcat"
    t0 = time.perf_counter()
    res = subprocess.run([kcat, "-P", "-b", bootstrap, "-t", topic, "-z", codec,
                          "-X", "linger.ms=20", "-X", "acks=all",
                          "-X", "enable.idempotence=true", "-l", str(data)],
                         capture_output=True)
    dt = time.perf_counter() - t0
    return {"lines": n, "seconds": round(dt, 3), "lines_per_s": round(n / dt),
            "rc": res.returncode, "codec": codec, "messages": "one per line",
            "stderr": res.stderr.decode()[-300:]}


def stall(bootstrap: str | None, n: int, size: int, tmp: Path, tag: str) -> dict[str, Any]:
    child = [sys.executable, "-c", WRITER, str(n), str(size)]
    t0 = time.perf_counter()
    if bootstrap is None:  # baseline: the same writer into a pipe drained by cat
        res = subprocess.run(child, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    else:
        res = subprocess.run(agent_argv(bootstrap, f"bench{uuid.uuid4().hex[:6]}.",
                                        tmp / f"sp-{tag}", child, 3),
                             stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    out = last_json(res.stderr)
    out["wall_s"] = round(time.perf_counter() - t0, 3)
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--bootstrap", default=os.environ.get("FAULTWATCH_BOOTSTRAP",
                                                          "127.0.0.1:19092"))
    ap.add_argument("--lines", type=int, default=1_000_000)
    ap.add_argument("--size", type=int, default=100, help="bytes per line")
    ap.add_argument("--stall-lines", type=int, default=300_000)
    a = ap.parse_args()
    from aiokafka.codec import has_zstd

    codec = "zstd" if has_zstd() else "gzip"
    with tempfile.TemporaryDirectory() as td:
        tmp = Path(td)
        data = tmp / "lines.txt"
        pad = "x" * max(0, a.size - 30)
        with data.open("w") as f:
            for i in range(a.lines):
                f.write(f"step {i:09d} loss=0.1234 {pad}\n")
        result = {
            "lines": a.lines, "line_bytes": a.size, "agent_compression": codec,
            "cpus": os.cpu_count(),
            "agent": agent_throughput(a.bootstrap, data, a.lines, tmp),
            "kcat": kcat_throughput(a.bootstrap, data, a.lines, codec),
            "stall_baseline_pipe_to_devnull": stall(None, a.stall_lines, a.size, tmp, "b"),
            "stall_broker_up": stall(a.bootstrap, a.stall_lines, a.size, tmp, "up"),
            "stall_broker_unreachable": stall(UNREACHABLE, a.stall_lines, a.size, tmp, "down"),
        }
    print(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
