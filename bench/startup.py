"""Start-up cost of the rules: built-in rules loaded and compiled, and `rules classify` of one
line, each in a fresh process; prints one JSON object.

Rows (CPU seconds of the child, from its rusage; wall seconds beside them):
- `compile_cold`: an empty compiled-database cache (a fresh one: every database compiled and
  the validation compile run, then both kept);
- `compile_warm`: the same cache again (every database loaded, authenticated, from it);
- `compile_no_cache`: FAULTWATCH_RULES_CACHE=off (the cost every start paid before the cache);
- `classify_one_line`: `faultwatch rules classify FILE` of a one-line file, warm cache (the
  whole CLI: interpreter start, imports, rules, one match), best and median of --reps;
- peers in the same run, as many reps: `interpreter_only` (`python -c pass`, the floor every
  command pays), `cli_version` (`faultwatch --version`: the CLI without a command) and, with
  --peer-src DIR (a checkout of another revision, e.g. `git worktree add /tmp/fw-main main`),
  `classify_one_line_peer`: the same classify imported from that checkout (and
  `classify_one_line_this_src`, this tree imported the same way).
The machine's load average is printed with them: on a shared machine compare CPU seconds.

    .venv/bin/python bench/startup.py [--reps 5] [--peer-src DIR]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

CHILD = """
import time
t0 = time.process_time()
from faultwatch.rules import Matcher, load_ruleset
from faultwatch.rules import dbcache
t1 = time.process_time()
rs = load_ruleset()
t2 = time.process_time()
Matcher(rs)
t3 = time.process_time()
import json, sys
json.dump({"import_cpu_s": t1 - t0, "load_cpu_s": t2 - t1, "matcher_cpu_s": t3 - t2,
           "cache": dict(dbcache.stats)}, sys.stdout)
"""


def child(cmd: list[str], env: dict[str, str]) -> tuple[float, float, str]:
    """(CPU s, wall s, stdout) of one child process."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t = time.monotonic()
    out = subprocess.run(cmd, env=env, check=True, capture_output=True, text=True).stdout
    wall = time.monotonic() - t
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return cpu, wall, out


def compile_row(env: dict[str, str]) -> dict[str, object]:
    cpu, wall, out = child([sys.executable, "-c", CHILD], env)
    parts = json.loads(out)
    return {"process_cpu_s": round(cpu, 3), "wall_s": round(wall, 3),
            "rules_cpu_s": round(parts["load_cpu_s"] + parts["matcher_cpu_s"], 3),
            **{k: round(v, 3) if isinstance(v, float) else v for k, v in parts.items()}}


FROM_SRC = """
import sys
sys.meta_path[:] = [f for f in sys.meta_path if "editable" not in getattr(f, "__module__", "")
                    and "editable" not in getattr(type(f), "__module__", "")]
sys.path.insert(0, sys.argv.pop(1))
from faultwatch.cli import main
sys.exit(main(sys.argv[1:]))
"""  # the console script's own two lines, importing faultwatch from the directory given


def timed(cmd: list[str], env: dict[str, str], reps: int) -> dict[str, float]:
    """Best and median wall and CPU seconds of `reps` runs of cmd."""
    runs = [child(cmd, env)[:2] for _ in range(reps)]
    walls = sorted(w for _, w in runs)
    cpus = sorted(c for c, _ in runs)
    return {"wall_s_best": round(walls[0], 3), "wall_s_median": round(statistics.median(walls), 3),
            "cpu_s_best": round(cpus[0], 3), "cpu_s_median": round(statistics.median(cpus), 3)}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--peer-src", metavar="DIR",
                    help="a checkout whose faultwatch package classifies the same line (peer)")
    args = ap.parse_args()
    cli = str(Path(sys.executable).with_name("faultwatch"))
    with tempfile.TemporaryDirectory() as tmp:
        env = {**os.environ, "FAULTWATCH_RULES_CACHE": str(Path(tmp) / "cache")}
        out: dict[str, object] = {"loadavg_before": os.getloadavg()}
        out["compile_cold"] = compile_row(env)
        out["compile_warm"] = compile_row(env)
        out["compile_no_cache"] = compile_row({**env, "FAULTWATCH_RULES_CACHE": "off"})
        one = Path(tmp) / "one.log"
        one.write_text("RuntimeError: CUDA error: an illegal memory access was encountered\n")
        classify = [sys.executable, cli, "rules", "classify", str(one)]
        out["classify_one_line"] = row = timed(classify, env, args.reps)
        out["interpreter_only"] = timed([sys.executable, "-c", "pass"], env, args.reps)
        out["cli_version"] = timed([sys.executable, cli, "--version"], env, args.reps)
        if args.peer_src:  # this tree and the peer, both imported by FROM_SRC, alternating
            srcs = {"classify_one_line_this_src": Path(__file__).resolve().parents[1],
                    "classify_one_line_peer": Path(args.peer_src).resolve()}
            for name, src in srcs.items():
                out[name] = timed([sys.executable, "-c", FROM_SRC, str(src), "rules",
                                   "classify", str(one)], env, args.reps)
        walls = [row["wall_s_best"]]
        out["targets"] = {"compile_warm_rules_cpu_s_le_0.5":
                          out["compile_warm"]["rules_cpu_s"] <= 0.5,  # type: ignore[index]
                          "classify_wall_s_le_1": walls[0] <= 1.0}
        out["loadavg_after"] = os.getloadavg()
    print(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
