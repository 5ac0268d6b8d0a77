"""A noisy neighbour against one worker: bench/fleet.py twice on the same broker and seed, the
control (--jobs ordinary jobs) and the same fleet beside one job whose node prints
--flood-lines-per-s for --flood-s; prints one JSON object with both runs' decisions and how
much later the ordinary jobs' error and hang decisions came with the flood (the target: at
most 5 s, every fault decided, none false).

    .venv/bin/python bench/noisy_neighbour.py --bootstrap 127.0.0.1:29092 [--jobs 1000]
        [--flood-lines-per-s 200000] [--flood-s 60] [--duration-s 120] [--order flood-first]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

HERE = Path(__file__).parent


def fleet(args: argparse.Namespace, flood: float, out: Path) -> dict[str, Any]:
    cmd = [sys.executable, str(HERE / "fleet.py"), "--bootstrap", args.bootstrap,
           "--jobs", str(args.jobs), "--duration-s", str(args.duration_s),
           "--drain-timeout-s", str(args.drain_timeout_s), "--seed", str(args.seed),
           "--workdir", args.workdir, "--out", str(out),
           "--flood-lines-per-s", str(flood), "--flood-s", str(args.flood_s),
           "--flood-start-s", str(args.flood_start_s)]
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
    return json.loads(out.read_text())


def brief(run: dict[str, Any]) -> dict[str, Any]:
    d = run["decisions"]
    return {"expected": d["expected"], "correct": d["correct"], "missed": d["missed"],
            "false_decisions": d["false_decisions"], "false_examples": d["false_examples"][:3],
            "error_latency_s": d["error_latency_s"],
            "hang_latency_after_window_s": d["hang_latency_after_window_s"],
            "flood_lines": d.get("flood_lines", 0), "flood_notices": d.get("flood_notices", []),
            "processor_cpu_pct": run["processor"]["cpu_pct_during_load"],
            "logs_lag_records_max": run["processor"]["logs_lag_records_max"],
            "generator_cpu_pct": run["generator"]["cpu_pct"],
            "generator_lines_per_s": run["generator"]["lines_per_s"]}


def later(flood: dict[str, Any], control: dict[str, Any], what: str) -> dict[str, Any]:
    f, c = flood["decisions"][what], control["decisions"][what]
    return {k: (round(f[k] - c[k], 3) if f.get(k) is not None and c.get(k) is not None
                else None) for k in ("p50", "p99", "max")}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--bootstrap", default="127.0.0.1:29092")
    ap.add_argument("--jobs", type=int, default=1000)
    ap.add_argument("--duration-s", type=float, default=120.0)
    ap.add_argument("--drain-timeout-s", type=float, default=90.0)
    ap.add_argument("--flood-lines-per-s", type=float, default=200_000.0)
    ap.add_argument("--flood-s", type=float, default=60.0)
    ap.add_argument("--flood-start-s", type=float, default=20.0)
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--order", choices=["control-first", "flood-first"], default="control-first")
    ap.add_argument("--workdir", default="/tmp/fleetbench")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        runs: dict[str, dict[str, Any]] = {}
        order = ["control", "flood"] if args.order == "control-first" else ["flood", "control"]
        load = {"before": os.getloadavg()}
        for name in order:
            runs[name] = fleet(args, args.flood_lines_per_s if name == "flood" else 0.0,
                               Path(tmp) / f"{name}.json")
            load[f"after_{name}"] = os.getloadavg()
    f, c = runs["flood"], runs["control"]
    delay = {"error": later(f, c, "error_latency_s"),
             "hang": later(f, c, "hang_latency_after_window_s")}
    worst = max((v for d in delay.values() for v in d.values() if v is not None), default=None)
    fd = f["decisions"]
    out = {"config": vars(args), "loadavg": load,
           "control": brief(c), "flood": brief(f),
           "flood_delay_s": delay,
           "target": {"delay_max_le_5s": worst is not None and worst <= 5.0,
                      "all_decided": fd["missed"] == 0 and sum(fd["correct"].values())
                      == fd["expected"], "none_false": fd["false_decisions"] == 0}}
    print(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
