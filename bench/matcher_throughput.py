"""Matcher throughput on a synthetic training log, against ripgrep with the same patterns.

Three figures on the same lines, one core each:
- `matcher_lines_per_s`: Matcher.match_lines on batches of Line objects (rule hits, progress
  marks, per-rank liveness), against `rg -j1 -c -f PATTERNS` with the same patterns;
- `stage_lines_per_s`: the processor's whole matcher stage per logs record: decode the
  record (orjson, Line objects), match, build the signals and encode each one;
- `floor_*`: what a batch costs before any matching logic: the Python list of texts and
  the join alone, and the hyperscan scan alone (a bound on what match_lines can reach).

`--cases` adds the same lines with what launchers put before every line (srun -l labels,
torch's `[rankN]:`, kubectl --timestamps with a time per line, both, DeepSpeed's `[Rank N]`,
mpirun --tag-output), each Matcher.match_lines against rg on those same lines; `--repeat R`
interleaves R runs of each and reports the median of the per-run ratios (the machine may be
busy: both sides see the same load).

rg's time includes its start: reading and compiling the ~400 patterns (~0.1 s, about as
long as it takes to scan 200 k lines) while the Matcher is built before its clock starts.
`rg_start_s` is rg with the same patterns on a one-line file (best of 3), and the
`*_vs_rg_scan` ratios compare against rg's time minus that start: rg's steady rate, the
fair peer for a long-running processor. Both are printed; the scan ratio is the one that
counts (at 200 k lines the start is half of rg's time and flatters the matcher).

`--stage` (the figure issue 25 sets targets for) runs the processor's whole matcher stage,
`MatcherStage.process_batch`, per case on logs records as the agent sends them (`chunks`: the
lines of one read in one string, `--chunk-lines` per read) and as one row per line (`rows`,
what older senders and the fleet bench write), against rg's scan of the same lines in the
same run. Times are CPU seconds (the thread's for the stage, rusage of the children for rg),
so a busy machine slows both alike; wall-clock ratios are printed beside them. Each case
also prints `digest`: sha256 of every signals record the stage produced, in order (the
signals are part of the contract: a change that should not change them is checked with
`--expect-digests bench/matcher_digests.json`, exit 1 on a difference; `--write-digests`
records them after a change that should, e.g. new rules). It then prints the stage's top
functions (cProfile on the thread's CPU clock) for the `[rankN]:` case, by self and by
cumulative time (`--no-profile` skips it).
"""

from __future__ import annotations

import argparse
import cProfile
import hashlib
import io
import json
import pstats
import random
import re
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
import peers

from faultwatch.core.events import STDOUT, Line
from faultwatch.core.policy import Policy
from faultwatch.rules import Matcher, load_ruleset
from faultwatch.streams.logs_to_signals import signals_of_record as signals_of
from faultwatch.streams.matcher_stage import MatcherStage
from faultwatch.streams.records import InRecord, LiveRules
from faultwatch.wire import decode_logs, encode_line_chunks, encode_lines, encode_signal

WARNINGS = [
    "/usr/lib/python3.11/site-packages/torch/utils/checkpoint.py:464: UserWarning: "
    "torch.utils.checkpoint: the use_reentrant parameter should be passed explicitly.",
    "[W reducer.cpp:1346] Warning: find_unused_parameters=True was specified in DDP "
    "constructor, but did not find any unused parameters in the forward pass.",
    "node3:1234:5678 [2] NCCL INFO Channel 03/0 : 2[2] -> 3[3] via P2P/IPC/read",
    "[2024-05-01 10:00:00,123] [INFO] [logging.py:96:log_dist] [Rank 0] time (ms) | "
    "fwd: 123.45 | bwd: 234.56 | bwd_inner: 200.12 | optimizer_step: 12.34",
    "Token indices sequence length is longer than the specified maximum sequence length",
]
ERRORS = [
    ["Traceback (most recent call last):", '  File "train.py", line 10, in <module>',
     "    main()", "    ^^^^^^", "RuntimeError: CUDA out of memory. Tried to allocate 2.00 GiB"],
    ["[E ProcessGroupNCCL.cpp:475] [Rank 3] Watchdog caught collective operation timeout: "
     "WorkNCCL(SeqNum=7, OpType=ALLREDUCE, Timeout(ms)=600000) ran for 600123 milliseconds"],
    ["node2:1:9 [0] NCCL WARN NET/IB : Got async event : port error"],
]


def gen_lines(n: int, seed: int = 7) -> list[str]:
    """A mix of ordinary training output with rare errors."""
    rnd = random.Random(seed)
    out: list[str] = []
    step = 0
    while len(out) < n:
        x = rnd.random()
        if x < 0.30:
            step += 1
            out.append(f" iteration {step:8d}/ 500000 | consumed samples: {step * 128:12d} | "
                       f"elapsed time per iteration (ms): {rnd.uniform(900, 1100):.1f} | "
                       f"learning rate: 3.000E-04 | lm loss: {rnd.uniform(1.5, 3):.6E} | "
                       "loss scale: 65536.0 | grad norm: 1.234 |")
        elif x < 0.45:
            p = rnd.randint(0, 1000)
            out.append(f"{p // 10:3d}%|{'#' * (p // 100):10s}| {p}/1000 [01:23<01:40,  5.49it/s]")
        elif x < 0.57:
            out.append(f"{{'loss': {rnd.uniform(1, 3):.4f}, 'grad_norm': {rnd.uniform(0, 2):.3f}, "
                       f"'learning_rate': 1e-05, 'epoch': {rnd.uniform(0, 3):.2f}}}")
        elif x < 0.72:
            r = rnd.randint(0, 7)
            out.append(f"[rank{r}]:[2024-05-01 10:00:0{r}] batch {rnd.randint(0, 10**6)} "
                       f"tokens/s {rnd.uniform(1e4, 2e4):.1f} mem {rnd.uniform(30, 70):.1f}GB")
        elif x < 0.87:
            out.append(rnd.choice(WARNINGS))
        elif x < 0.99995:
            out.append(f"[2024-05-01 10:00:00] INFO data loader worker {rnd.randint(0, 15)} "
                       f"prefetched shard {rnd.randint(0, 9999):05d} in {rnd.uniform(0, 1):.3f}s")
        else:
            out.extend(rnd.choice(ERRORS))
    return out[:n]


def _k8s(i: int) -> str:
    return f"2025-04-09T17:{i // 60_000 % 60:02d}:{i // 1000 % 60:02d}.{i % 1000:03d}{i:06d}Z "


# what one launcher puts before every line, by line number (as they do: srun pads labels)
CASES: dict[str, Any] = {
    "srun -l": lambda i: f"{i % 16:>2}: ",
    "[rankN]:": lambda i: f"[rank{i % 8}]:",
    "kubectl --timestamps": _k8s,
    "kubectl --timestamps + srun -l": lambda i: _k8s(i) + f"{i % 16:>2}: ",
    "DeepSpeed [Rank N]": lambda i: f"[Rank {i % 8}] ",
    "mpirun --tag-output": lambda i: f"[1,{i % 8}]<stdout>:",
}


def run_case(matcher: Matcher, pats: list[str], texts: list[str], batch: int,
             repeat: int) -> dict[str, object]:
    """Matcher.match_lines and rg on the same lines, interleaved `repeat` times (rg's start
    measured again each time, on a one-line file)."""
    ratios: list[float] = []
    scan_ratios: list[float] = []
    best_m = best_rg = best_start = float("inf")
    for _ in range(repeat):
        secs = run_matcher(matcher, texts, batch)[0]
        rg = run_rg(pats, texts, runs=1)
        start = run_rg(pats, texts[:1], runs=1)
        best_m = min(best_m, secs)
        if rg is not None and start is not None:
            best_rg = min(best_rg, rg[0])
            best_start = min(best_start, start[0])
            ratios.append(rg[0] / secs)
            scan_ratios.append(max(rg[0] - start[0], 1e-6) / secs)
    out: dict[str, object] = {"matcher_lines_per_s": round(len(texts) / best_m)}
    if ratios:
        scan_s = max(best_rg - best_start, 1e-6)
        out.update({"rg_lines_per_s": round(len(texts) / best_rg),
                    "ratio_vs_rg_median": round(statistics.median(ratios), 2),
                    "ratios": [round(r, 2) for r in ratios],
                    "rg_scan_lines_per_s": round(len(texts) / scan_s),
                    "ratio_vs_rg_scan_median": round(statistics.median(scan_ratios), 2)})
    return out


def run_matcher(matcher: Matcher, texts: list[str], batch: int) -> tuple[float, int, int]:
    batches = [[Line(STDOUT, i + j, float(i + j), t) for j, t in enumerate(texts[i:i + batch])]
               for i in range(0, len(texts), batch)]
    t0 = time.perf_counter()
    n_matches = n_progress = 0
    for b in batches:
        res = matcher.match_lines(b, default_rank=0)
        n_matches += len(res.matches)
        n_progress += len(res.progress)
    return time.perf_counter() - t0, n_matches, n_progress


def run_stage(matcher: Matcher, texts: list[str], batch: int) -> tuple[float, int]:
    """decode + match + encode signals, per logs record of `batch` lines (best of 3)."""
    recs = [encode_lines("job", 0, "node-0", "run", [Line(STDOUT, i + j, float(i + j), t)
                                                     for j, t in enumerate(texts[i:i + batch])],
                         rank=0)
            for i in range(0, len(texts), batch)]
    best, n_out = float("inf"), 0
    for _ in range(3):
        t0 = time.perf_counter()
        n_out = 0
        for rec in recs:
            for sig in signals_of(decode_logs(rec), matcher):
                encode_signal(sig)
                n_out += 1
        best = min(best, time.perf_counter() - t0)
    return best, n_out


def run_floor(matcher: Matcher, texts: list[str], batch: int) -> tuple[float, float]:
    """(seconds for texts list + join + encode, seconds for the hyperscan scans alone)."""
    batches = [[Line(STDOUT, i + j, float(i + j), t) for j, t in enumerate(texts[i:i + batch])]
               for i in range(0, len(texts), batch)]
    t0 = time.perf_counter()
    datas = ["\n".join([ln.text for ln in b]).encode() for b in batches]
    t_join = time.perf_counter() - t0
    scan = matcher._scan  # noqa: SLF001 - the engine's own scanner, for the floor figure
    t0 = time.perf_counter()
    for d in datas:
        scan(d)
    return t_join, time.perf_counter() - t0


def run_rg(patterns: list[str], texts: list[str], runs: int = 3) -> tuple[float, int] | None:
    rg = shutil.which("rg")
    if rg is None:
        return None
    with tempfile.TemporaryDirectory() as d:
        f = Path(d) / "log.txt"
        f.write_text("\n".join(texts) + "\n")
        pf = Path(d) / "patterns.txt"
        pf.write_text("\n".join(patterns) + "\n")
        cmd = [rg, "-j1", "--no-config", "-c", "-f", str(pf), str(f)]
        best, count = float("inf"), 0
        for _ in range(runs):
            t0 = time.perf_counter()
            cp = subprocess.run(cmd, capture_output=True, text=True, check=False)
            best = min(best, time.perf_counter() - t0)
            if cp.returncode not in (0, 1):
                raise RuntimeError(cp.stderr)
            count = int(cp.stdout.strip() or 0)
    return best, count


STAGE_NOW = 2_000_000_000.0  # the stage's clock (only lag metrics read it)


def stage_records(texts: list[str], batch: int, chunk_lines: int, form: str) -> list[InRecord]:
    """Logs records of `batch` lines each, node mode (no rank: the agent wraps the launcher),
    as the agent sends them (`chunks`, one per read of `chunk_lines` lines, one time each)
    or one row per line (`rows`)."""
    recs: list[InRecord] = []
    for k, i in enumerate(range(0, len(texts), batch)):
        part = texts[i:i + batch]
        if form == "chunks":
            value = encode_line_chunks("job", 0, "node-0", "run", [
                Line(STDOUT, i + j, float(i + j), "\n".join(part[j:j + chunk_lines]))
                for j in range(0, len(part), chunk_lines)])
        else:
            value = encode_lines("job", 0, "node-0", "run", [
                Line(STDOUT, i + j, float(i + j), t) for j, t in enumerate(part)])
        recs.append(InRecord("faultwatch.logs", 0, k, b"job/node-0", value))
    return recs


def _refuse(rec: InRecord, err: Exception) -> None:
    raise RuntimeError(f"the bench's record {rec.where} was dead-lettered: {err!r}")


def run_stage_records(matcher: Matcher, recs: list[InRecord], per_call: int = 10
                      ) -> tuple[float, float, str, int]:
    """(CPU s, wall s, sha256 of every signals record in order, records out) for the whole
    matcher stage over `recs`, `per_call` records per process_batch (a consumer batch)."""
    stage = MatcherStage(LiveRules(matcher, Policy(), "bench"), _refuse)
    outs: list[list[tuple[bytes, bytes]]] = []
    c0, w0 = time.thread_time(), time.perf_counter()
    for i in range(0, len(recs), per_call):
        outs.append(stage.process_batch(recs[i:i + per_call], STAGE_NOW))
    cpu, wall = time.thread_time() - c0, time.perf_counter() - w0
    h = hashlib.sha256()
    n = 0
    for out in outs:
        for key, value in out:
            h.update(len(key).to_bytes(4, "big") + key + len(value).to_bytes(4, "big") + value)
            n += 1
    return cpu, wall, h.hexdigest(), n


def run_rg_cpu(patterns: list[str], texts: list[str]) -> tuple[float, float] | None:
    """(CPU s, wall s) of one `rg -j1 -c -f` over the lines (rusage of the children)."""
    rg = shutil.which("rg")
    if rg is None:
        return None
    with tempfile.TemporaryDirectory() as d:
        f = Path(d) / "log.txt"
        f.write_text("\n".join(texts) + "\n")
        pf = Path(d) / "patterns.txt"
        pf.write_text("\n".join(patterns) + "\n")
        r0 = resource.getrusage(resource.RUSAGE_CHILDREN)
        w0 = time.perf_counter()
        cp = subprocess.run([rg, "-j1", "--no-config", "-c", "-f", str(pf), str(f)],
                            capture_output=True, text=True, check=False)
        wall = time.perf_counter() - w0
        r1 = resource.getrusage(resource.RUSAGE_CHILDREN)
        if cp.returncode not in (0, 1):
            raise RuntimeError(cp.stderr)
    return r1.ru_utime + r1.ru_stime - r0.ru_utime - r0.ru_stime, wall


def run_stage_case(matcher: Matcher, pats: list[str], texts: list[str], args: Any
                   ) -> dict[str, object]:
    """The matcher stage on both record forms against rg's scan of the same lines, `repeat`
    interleaved runs each; medians of the per-run ratios (CPU and wall)."""
    out: dict[str, object] = {}
    for form in ("chunks", "rows"):
        recs = stage_records(texts, args.batch, args.chunk_lines, form)
        cpu_r: list[float] = []
        wall_r: list[float] = []
        best = float("inf")
        digests = set()
        for _ in range(args.repeat):
            cpu, wall, digest, n_out = run_stage_records(matcher, recs)
            digests.add(digest)
            best = min(best, cpu)
            rg = run_rg_cpu(pats, texts)
            start = run_rg_cpu(pats, texts[:1])
            if rg is not None and start is not None:
                cpu_r.append(max(rg[0] - start[0], 1e-6) / cpu)
                wall_r.append(max(rg[1] - start[1], 1e-6) / wall)
        if len(digests) != 1:
            raise RuntimeError(f"the stage's output differs between runs: {digests}")
        res: dict[str, object] = {"stage_lines_per_cpu_s": round(len(texts) / best),
                                  "signals_records": n_out, "digest": digests.pop()}
        if cpu_r:
            res.update({"vs_rg_scan_cpu_median": round(statistics.median(cpu_r), 2),
                        "vs_rg_scan_cpu": [round(r, 2) for r in cpu_r],
                        "vs_rg_scan_wall_median": round(statistics.median(wall_r), 2)})
        out[form] = res
    return out


def stage_profile(matcher: Matcher, texts: list[str], args: Any, top: int = 12
                  ) -> dict[str, list[list[object]]]:
    """The stage's top functions on the thread's CPU clock, by self and cumulative time."""
    recs = stage_records(texts, args.batch, args.chunk_lines, "chunks")
    prof = cProfile.Profile(time.thread_time)
    prof.enable()
    run_stage_records(matcher, recs)
    prof.disable()
    out: dict[str, list[list[object]]] = {}
    for key in ("tottime", "cumtime"):
        buf = io.StringIO()
        st = pstats.Stats(prof, stream=buf)
        st.sort_stats(key).print_stats(top)
        print(f"# stage profile, [rankN]: lines, by {key}\n{buf.getvalue()}", file=sys.stderr)
        rows = []
        for (file, line, func), (_cc, nc, tt, ct, _) in sorted(
                st.stats.items(), key=lambda kv: -kv[1][2 if key == "tottime" else 3])[:top]:
            where = f"{Path(file).name}:{line}({func})" if line else func
            rows.append([where, nc, round(tt, 4), round(ct, 4)])
        out[key] = rows
    return out


def check_digests(path: str, got: dict[str, dict[str, str]], args: Any) -> list[str]:
    """Differences between the digests recorded in `path` and this run's."""
    want = json.loads(Path(path).read_text())
    params = {"lines": args.lines, "batch": args.batch, "chunk_lines": args.chunk_lines}
    if want.get("params") != params:
        return [f"{path} was written with {want.get('params')}, this run is {params}"]
    return [f"{case} {form}: {want['digests'].get(case, {}).get(form)} -> {d}"
            for case, forms in got.items() for form, d in forms.items()
            if want["digests"].get(case, {}).get(form) != d]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--lines", type=int, default=2_000_000)
    ap.add_argument("--batch", type=int, default=500)
    ap.add_argument("--engine", default="auto", choices=("auto", "hyperscan", "re2"))
    ap.add_argument("--prefix", default="", help="put this before every line, e.g. a "
                    "kubectl --timestamps stamp '2025-04-09T17:15:22.123456789Z ' or an "
                    "srun -l label '3: ' (measures the line-prefix normaliser)")
    ap.add_argument("--cases", action="store_true",
                    help="also each launcher's prefix on every line, against rg (CASES)")
    ap.add_argument("--repeat", type=int, default=3,
                    help="interleaved runs of matcher and rg per case (median ratio)")
    ap.add_argument("--stage", action="store_true",
                    help="the whole matcher stage per case and record form vs rg (see above)")
    ap.add_argument("--chunk-lines", type=int, default=100,
                    help="lines per read in the agent's chunk records (--stage)")
    ap.add_argument("--no-profile", dest="profile", action="store_false",
                    help="with --stage: skip the stage's profile (top functions on [rankN]: "
                         "lines, printed by default)")
    ap.add_argument("--expect-digests", metavar="FILE",
                    help="with --stage: exit 1 when a case's signals differ from FILE's")
    ap.add_argument("--write-digests", metavar="FILE",
                    help="with --stage: record this run's digests in FILE")
    peers.add_argument(ap)
    args = ap.parse_args(argv)
    peers.need("rg", args.install_peers)  # the comparison is the point: no figure without it
    texts = [args.prefix + t for t in gen_lines(args.lines)]
    matcher = Matcher(load_ruleset(), engine=args.engine)
    if args.stage:
        return stage_main(matcher, texts, args)
    runs = [run_matcher(matcher, texts, args.batch) for _ in range(3)]
    secs, n_matches, n_progress = min(runs)
    stage_s, n_signals = run_stage(matcher, texts, args.batch)
    floor_join, floor_scan = run_floor(matcher, texts, args.batch)
    # ripgrep joins -f patterns into one alternation: drop group names (they would clash)
    # and say `\v` for `\n` (one rule spans two lines; rg without -U refuses `\n`, and per line
    # `\v` never matches either: same work, no extra hits)
    pats = [("(?i)" if p.ignore_case else "")
            + re.sub(r"\(\?P?<([A-Za-z_]\w*)>", "(", p.source).replace("\\n", "\\v")
            for p in matcher.patterns]
    rg = run_rg(pats, texts)
    start = run_rg(pats, texts[:1])
    rg_start_s = start[0] if start is not None else 0.0
    out: dict[str, object] = {
        "lines": len(texts), "batch": args.batch, "engine": matcher.engine,
        "patterns": len(pats), "matcher_s": round(secs, 3),
        "matcher_lines_per_s": round(len(texts) / secs), "matches": n_matches,
        "progress_marks": n_progress,
        "stage_s": round(stage_s, 3), "stage_lines_per_s": round(len(texts) / stage_s),
        "stage_signals": n_signals,
        "floor_texts_join_lines_per_s": round(len(texts) / floor_join),
        "floor_scan_lines_per_s": round(len(texts) / floor_scan),
    }
    if rg is not None:
        rg_scan_s = max(rg[0] - rg_start_s, 1e-6)
        out.update({"rg_s": round(rg[0], 3), "rg_lines_per_s": round(len(texts) / rg[0]),
                    "rg_start_s": round(rg_start_s, 3),
                    "rg_scan_lines_per_s": round(len(texts) / rg_scan_s),
                    "rg_matching_lines": rg[1], "ratio_vs_rg": round(rg[0] / secs, 2),
                    "ratio_vs_rg_scan": round(rg_scan_s / secs, 2),
                    "stage_ratio_vs_rg": round(rg[0] / stage_s, 2),
                    "floor_scan_ratio_vs_rg": round(rg[0] / floor_scan, 2)})
    if rg is not None:
        out["plain"] = run_case(matcher, pats, texts, args.batch, args.repeat)
    if args.cases:
        for name, prefix in CASES.items():
            case = [prefix(i) + t for i, t in enumerate(texts)]
            out[name] = run_case(matcher, pats, case, args.batch, args.repeat)
    print(json.dumps(out, indent=2))
    return 0


def rg_patterns(matcher: Matcher) -> list[str]:
    """The matcher's patterns as ripgrep takes them: group names dropped (they would clash in
    rg's one alternation) and `\\v` for `\\n` (one rule spans two lines; rg without -U refuses
    `\\n`, and per line `\\v` never matches either: same work, no extra hits)."""
    return [("(?i)" if p.ignore_case else "")
            + re.sub(r"\(\?P?<([A-Za-z_]\w*)>", "(", p.source).replace("\\n", "\\v")
            for p in matcher.patterns]


def stage_main(matcher: Matcher, texts: list[str], args: Any) -> int:
    pats = rg_patterns(matcher)
    out: dict[str, Any] = {"lines": len(texts), "batch": args.batch,
                           "chunk_lines": args.chunk_lines, "engine": matcher.engine,
                           "patterns": len(pats), "repeat": args.repeat,
                           "rg": shutil.which("rg") is not None}
    digests: dict[str, dict[str, str]] = {}
    for name, prefix in [("plain", None), *CASES.items()]:
        case = texts if prefix is None else [prefix(i) + t for i, t in enumerate(texts)]
        res = run_stage_case(matcher, pats, case, args)
        out[name] = res
        digests[name] = {form: r["digest"] for form, r in res.items()}  # type: ignore[index]
    if args.profile:
        case = [CASES["[rankN]:"](i) + t for i, t in enumerate(texts)]
        out["profile_rankN_chunks"] = stage_profile(matcher, case, args)
    params = {"lines": args.lines, "batch": args.batch, "chunk_lines": args.chunk_lines}
    if args.write_digests:
        Path(args.write_digests).write_text(json.dumps(
            {"params": params, "digests": digests}, indent=2) + "\n")
    bad: list[str] = []
    if args.expect_digests:
        bad = check_digests(args.expect_digests, digests, args)
        out["digests_match"] = not bad
        out["digest_differences"] = bad
    print(json.dumps(out, indent=2))
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
