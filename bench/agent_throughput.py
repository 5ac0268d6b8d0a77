"""Bench: agent lines/s into a real broker vs kcat -P, agent CPU, child write stalls."""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
import peers

UNREACHABLE = "127.0.0.1:9"

# The child: n lines at `rate` lines/s (0: as fast as it can), one os.write per line, each
# write timed (a write that waits is a stall: the pipe was full because the agent lagged).
WRITER = r"""
import json, os, sys, time
n, size, rate = int(sys.argv[1]), int(sys.argv[2]), float(sys.argv[3])
pad = b"x" * max(0, size - 30)
lat = []
t0 = time.perf_counter()
for i in range(n):
    if rate and i % 10 == 0:
        ahead = t0 + i / rate - time.perf_counter()
        if ahead > 0:
            time.sleep(ahead)
    line = b"step %09d loss=0.1234 " % i + pad + b"\n"
    a = time.perf_counter()
    os.write(1, line)
    lat.append(time.perf_counter() - a)
total = time.perf_counter() - t0
lat.sort()
q = lambda p: lat[min(len(lat) - 1, int(p * len(lat)))] * 1e6
print(json.dumps({"lines": n, "rate": rate, "child_s": round(total, 3),
                  "child_cpu_s": round(time.process_time(), 3), "p50_us": round(q(0.5), 1),
                  "p99_us": round(q(0.99), 1), "p999_us": round(q(0.999), 1),
                  "max_us": round(lat[-1] * 1e6, 1)}), file=sys.stderr)
"""


def agent_argv(bootstrap: str, prefix: str, spool: Path, cmd: list[str], flush_s: float,
               *extra: str) -> list[str]:
    return [sys.executable, "-m", "faultwatch", "agent", "--bootstrap", bootstrap,
            "--job", "bench", "--node", "n1", "--topic-prefix", prefix, "--spool-dir",
            str(spool), "--exit-flush-timeout-s", str(flush_s), "--no-follow-decisions",
            *extra, "--", *cmd]


def last_json(stderr: bytes) -> dict[str, Any]:
    for raw in reversed(stderr.splitlines()):
        if raw.startswith(b"{"):
            return dict(json.loads(raw))
    raise RuntimeError(stderr.decode()[-2000:])


def run_measured(argv: list[str], spy: str = ""
                 ) -> tuple[subprocess.CompletedProcess[bytes], float]:
    """Run argv to its end; (result, wall seconds). With `spy`, py-spy records it."""
    t0 = time.perf_counter()
    p = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    spy_p = None
    if spy:
        spy_p = subprocess.Popen(
            [str(Path(sys.executable).parent / "py-spy"), "record", "-p", str(p.pid), "-o",
             spy, "--format", "raw", "-r", "100"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    _, err = p.communicate()
    wall = time.perf_counter() - t0
    if spy_p is not None:
        try:
            spy_p.wait(30)  # py-spy ends with the process it records
        except subprocess.TimeoutExpired:
            spy_p.kill()
    return subprocess.CompletedProcess(argv, p.returncode or 0, b"", err), wall


def children_cpu() -> float:
    """CPU seconds of reaped children (the agent includes the writer it waited for)."""
    import resource

    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def agent_throughput(bootstrap: str, data: Path, n: int, tmp: Path, rep: int,
                     cmd: list[str] | None = None) -> tuple[float, float]:
    """(lines/s, CPU seconds of the agent and its child) shipping `cat data`."""
    prefix = f"bench{uuid.uuid4().hex[:6]}."
    cpu0 = children_cpu()
    res, dt = run_measured(agent_argv(bootstrap, prefix, tmp / f"sp-tp{rep}",
                                      cmd or ["cat", str(data)], 300))
    cpu = children_cpu() - cpu0
    if res.returncode != 0 or any((tmp / f"sp-tp{rep}").rglob("*.seg")):
        raise RuntimeError(f"agent run failed or left records: {res.stderr[-1000:]!r}")
    return n / dt, cpu


def kcat_throughput(kcat: str, bootstrap: str, data: Path, n: int, codec: str
                    ) -> tuple[float, float]:
    """(lines/s, CPU seconds) of kcat -P producing every line of data as a message."""
    topic = f"bench{uuid.uuid4().hex[:6]}.kcat"
    cpu0 = children_cpu()
    res, dt = run_measured([kcat, "-P", "-b", bootstrap, "-t", topic, "-z", codec,
                            "-X", "linger.ms=20", "-X", "acks=all",
                            "-X", "enable.idempotence=true", "-l", str(data)])
    cpu = children_cpu() - cpu0
    if res.returncode != 0:
        raise RuntimeError(res.stderr.decode()[-500:])
    return n / dt, cpu


def writer(bootstrap: str | None, n: int, size: int, rate: float, tmp: Path, tag: str,
           *extra: str, spy: str = "") -> dict[str, Any]:
    """Run the writer (under the agent unless bootstrap is None); its stall figures + CPU.
    With `spy`, py-spy records the agent (the process started here) into that file."""
    child = [sys.executable, "-c", WRITER, str(n), str(size), str(rate)]
    argv = child if bootstrap is None else agent_argv(
        bootstrap, f"bench{uuid.uuid4().hex[:6]}.", tmp / f"sp-{tag}", child, 3, *extra)
    cpu0 = children_cpu()
    res, wall = run_measured(argv, spy)
    cpu = children_cpu() - cpu0
    out = last_json(res.stderr)
    out["wall_s"] = round(wall, 3)
    if bootstrap is not None:
        agent_cpu = cpu - out["child_cpu_s"]
        out["agent_cpu_s"] = round(agent_cpu, 3)
        out["agent_cpu_pct_of_child_run"] = round(100 * agent_cpu / out["child_s"], 1)
        out["spool_cap_hit"] = b"event=spool_cap" in res.stderr
    return out


def profile_summary(path: str, top: int = 12) -> dict[str, Any]:
    """Sample shares of the agent's own work by function (self and inclusive), leaving out
    its start (imports) and its idle waits, from a py-spy raw file."""
    from collections import Counter

    idle = ("EpollSelector.select", "Condition.wait", "_do_waitpid", "_worker (concurrent")
    self_c: Counter[str] = Counter()
    incl: Counter[str] = Counter()
    total = 0
    try:
        text = Path(path).read_text()
    except OSError:
        return {"error": f"no profile at {path}"}
    for ln in text.splitlines():
        stack, _, cnt = ln.rpartition(" ")
        if not stack or not cnt.isdigit() or "_find_and_load" in stack \
                or any(m in stack.rsplit(";", 1)[-1] for m in idle):
            continue
        frames = stack.split(";")
        total += int(cnt)
        self_c[frames[-1]] += int(cnt)
        for f in set(frames):
            incl[f] += int(cnt)

    def fmt(c: Counter[str]) -> list[list[Any]]:
        return [[round(100 * v / max(1, total), 1), k[:140]] for k, v in c.most_common(top)]

    return {"busy_samples": total, "self_pct": fmt(self_c), "inclusive_pct": fmt(incl)}


def med(xs: list[float]) -> int:
    return round(statistics.median(xs))


def median_run(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """The run whose child time is the median (a real run, not a mix of fields)."""
    return sorted(runs, key=lambda r: r["child_s"])[len(runs) // 2]


def burst_summary(bare: list[dict[str, Any]], burst: list[dict[str, Any]]) -> dict[str, Any]:
    """A child writing flat out, bare (pipe to /dev/null) and under the agent: its time and
    write stalls, medians over the interleaved runs; slowdown_x = agent / bare."""
    def stat(runs: list[dict[str, Any]], k: str) -> float:
        return round(statistics.median(r[k] for r in runs), 3 if k == "child_s" else 1)

    return {
        "lines": bare[0]["lines"],
        "bare_child_s_median": stat(bare, "child_s"),
        "agent_child_s_median": stat(burst, "child_s"),
        "slowdown_x": round(stat(burst, "child_s") / stat(bare, "child_s"), 2),
        "bare_p999_us_median": stat(bare, "p999_us"),
        "agent_p999_us_median": stat(burst, "p999_us"),
        "bare_p99_us_median": stat(bare, "p99_us"),
        "agent_p99_us_median": stat(burst, "p99_us"),
        "bare_child_s_runs": [r["child_s"] for r in bare],
        "agent_child_s_runs": [r["child_s"] for r in burst],
        "note": "target: slowdown_x <= 2 and the p99.9 write stall no worse than bare"}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--bootstrap", default=os.environ.get("FAULTWATCH_BOOTSTRAP",
                                                          "127.0.0.1:19092"))
    ap.add_argument("--lines", type=int, default=1_000_000)
    ap.add_argument("--size", type=int, default=100, help="bytes per line")
    ap.add_argument("--reps", type=int, default=3, help="throughput repetitions (median)")
    ap.add_argument("--stall-lines", type=int, default=300_000)
    ap.add_argument("--py-spy", default="", help="profile the agent during one more burst "
                                                 "(py-spy raw file here) and summarize it")
    ap.add_argument("--cpu-seconds", type=float, default=5.0, help="duration of CPU runs")
    peers.add_argument(ap)
    a = ap.parse_args()
    kcat = peers.need("kcat", a.install_peers)  # before the broker: nothing runs without it
    from aiokafka.codec import has_zstd

    codec = "zstd" if has_zstd() else "gzip"
    with tempfile.TemporaryDirectory() as td:
        tmp = Path(td)
        data = tmp / "lines.txt"
        pad = "x" * max(0, a.size - 30)
        with data.open("w") as f:
            for i in range(a.lines):
                f.write(f"step {i:09d} loss=0.1234 {pad}\n")
        agent_tp, kcat_tp, agent_cpu, kcat_cpu, start_s = [], [], [], [], []
        for rep in range(a.reps):  # interleaved so both see the same machine load
            tp, cpu_s = agent_throughput(a.bootstrap, data, a.lines, tmp, rep)
            agent_tp.append(tp)
            agent_cpu.append(cpu_s)
            if kcat:
                tp, cpu_s = kcat_throughput(kcat, a.bootstrap, data, a.lines, codec)
                kcat_tp.append(tp)
                kcat_cpu.append(cpu_s)
            # the fixed cost in those runs: an agent shipping nothing (start, imports, exit)
            start_s.append(1 / agent_throughput(a.bootstrap, data, 1, tmp, 100 + rep,
                                                ["true"])[0])
        result: dict[str, Any] = {
            "lines": a.lines, "line_bytes": a.size, "codec": codec, "cpus": os.cpu_count(),
            "switch_interval_s": os.environ.get("FAULTWATCH_SWITCH_INTERVAL_S", "default"),
            "throughput_lines_per_s": {
                "agent_median": med(agent_tp), "agent_runs": [round(x) for x in agent_tp],
                "kcat_median": med(kcat_tp) if kcat_tp else "kcat not installed",
                "kcat_runs": [round(x) for x in kcat_tp],
                "agent_vs_kcat_x": round(med(agent_tp) / med(kcat_tp), 2) if kcat_tp else None,
                "agent_cpu_s_median": round(statistics.median(agent_cpu), 2),
                "kcat_cpu_s_median": round(statistics.median(kcat_cpu), 2) if kcat_cpu else None,
                "agent_empty_run_s_median": round(statistics.median(start_s), 2),
                "note": "the same file of lines into the same broker, topics auto-created "
                        "alike (one partition); agent: chunked records (<=256 KiB), "
                        "acks=all, idempotent, spooled, process start to last ack; "
                        "kcat -P -l: one message per line, same codec, linger and acks; "
                        "agent CPU includes its child (cat); agent_empty_run_s: the agent "
                        "running `true` (interpreter start, imports, exit), inside its time"},
        }
        cpu = {}
        for rate in (1000, 10000):
            r = writer(a.bootstrap, int(rate * a.cpu_seconds), a.size, rate, tmp, f"cpu{rate}")
            cpu[f"{rate}_lines_per_s"] = {k: r[k] for k in
                                          ("agent_cpu_s", "agent_cpu_pct_of_child_run",
                                           "child_s", "p99_us", "max_us")}
        result["agent_cpu"] = cpu
        n = a.stall_lines
        bare, burst = [], []
        for rep in range(a.reps):  # the same child flat out, bare and under the agent
            bare.append(writer(None, n, a.size, 0, tmp, f"b{rep}"))
            burst.append(writer(a.bootstrap, n, a.size, 0, tmp, f"up{rep}"))
        result["burst_child"] = burst_summary(bare, burst)
        stalls = {
            "baseline_pipe_to_devnull_flat_out": median_run(bare),
            "broker_up_100k_per_s": writer(a.bootstrap, n, a.size, 100_000, tmp, "up100"),
            "broker_up_flat_out": median_run(burst),
            "broker_down_100k_per_s": writer(UNREACHABLE, n, a.size, 100_000, tmp, "dn100"),
            "broker_down_flat_out": writer(UNREACHABLE, n, a.size, 0, tmp, "down"),
            "broker_down_at_spool_cap_2mb_100k_per_s": writer(
                UNREACHABLE, n, a.size, 100_000, tmp, "cap", "--spool-cap-mb", "2"),
        }
        keep = ("child_s", "p50_us", "p99_us", "p999_us", "max_us", "spool_cap_hit")
        result["child_write_stall"] = {k: {x: v[x] for x in keep if x in v}
                                       for k, v in stalls.items()}
        if a.py_spy:  # one more burst under the agent, profiled: where the agent's time goes
            spied = writer(a.bootstrap, n, a.size, 0, tmp, "spy", spy=a.py_spy)
            result["burst_profile"] = {"child_s": spied["child_s"],
                                       **profile_summary(a.py_spy)}
    print(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
