"""What the run ledger (issue 39: incidents and goodput) costs the job stage: the same signals
records through the job stage with the ledger folded (core/timeline.fold_job) and, the peer in
the same run, with the fold replaced by the identity; plus the bytes a stored state and a
ledger record take. Prints one JSON object.

    .venv/bin/python bench/ledger_cost.py --jobs 2000 --batches 40 --repeat 3

Each job: a run-start, then `--batches` records of progress (a ProgressBatch of 4 ranks' steps
and an Output, as a matcher sends for a batch of step lines), a checkpoint's stage marks every
10th record, heartbeats; one crash and restart per job half-way.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from faultwatch import wire  # noqa: E402
from faultwatch.core.events import (  # noqa: E402
    Exit,
    Heartbeat,
    Output,
    ProgressBatch,
    RankStep,
    RunStart,
    Stage,
)
from faultwatch.core.goodput import account  # noqa: E402
from faultwatch.core.policy import Policy  # noqa: E402
from faultwatch.rules import Matcher, load_ruleset  # noqa: E402
from faultwatch.streams.job_stage import DictStore, JobStage  # noqa: E402
from faultwatch.streams.records import InRecord, LiveRules  # noqa: E402
from faultwatch.wire.incidents import encode_ledger  # noqa: E402

T0 = 1_700_000_000.0
POLICY = Policy(settle_s=0.0, node_lost_s=600.0, fault_tolerant_policy="on_failure")


def records(jobs: int, batches: int) -> list[list[InRecord]]:
    """The records of the run, in rounds (one record a job a round)."""
    rounds: list[list[InRecord]] = []

    def rec(job: str, sigs: list[Any], k: int) -> InRecord:
        return InRecord("b.signals", 0, k, job.encode(), wire.encode_bundle(job, sigs))

    names = [f"job-{j:05d}" for j in range(jobs)]
    rounds.append([rec(j, [RunStart(j, 0, "n0", T0, run_id="r")], 0) for j in names])
    attempt = 0
    for b in range(1, batches + 1):
        ts = T0 + b
        out = []
        for j in names:
            if b == batches // 2:
                out.append(rec(j, [Exit(j, attempt, "n0", ts, 1, run_id="r")], b))
                continue
            if b == batches // 2 + 1:
                out.append(rec(j, [RunStart(j, attempt + 1, "n0", ts, run_id="r")], b))
                continue
            a = attempt + (1 if b > batches // 2 else 0)
            sigs: list[Any] = [Output(j, a, "n0", ts, 4, tuple((r, ts) for r in range(4)),
                                      run_id="r"),
                               ProgressBatch(j, a, "n0", tuple(RankStep(r, ts, b) for r in
                                                               range(4)), "r"),
                               Heartbeat(j, a, "n0", ts, True, ts, run_id="r")]
            if b % 10 == 0:
                sigs += [Stage(j, a, "n0", ts + 0.1, r, "checkpoint", True, step=b,
                               run_id="r") for r in range(4)]
                sigs += [Stage(j, a, "n0", ts + 0.5, r, "checkpoint", False, step=b,
                               run_id="r") for r in range(4)]
            out.append(rec(j, sigs, b))
        rounds.append(out)
    return rounds


def run_once(rounds: list[list[InRecord]], live: LiveRules, ledger: bool
             ) -> tuple[float, JobStage]:
    js = JobStage(live, DictStore(),
                  lambda r, e: (_ for _ in ()).throw(AssertionError(e)))
    if not ledger:
        js.account = lambda prev, st, sigs, decs: st  # type: ignore[method-assign]
    t = time.process_time()
    for k, rnd in enumerate(rounds):
        js.process_batch(rnd, T0 + k)
    return time.process_time() - t, js


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--jobs", type=int, default=2000)
    ap.add_argument("--batches", type=int, default=40)
    ap.add_argument("--repeat", type=int, default=3)
    a = ap.parse_args()
    rounds = records(a.jobs, a.batches)
    rs = load_ruleset(())
    live = LiveRules(Matcher(rs), POLICY, rs.version)
    n_sigs = sum(len(wire.decode_signals(r.value)) for rnd in rounds for r in rnd)  # type: ignore[arg-type]
    with_l, without = [], []
    js: JobStage | None = None
    for _ in range(a.repeat):
        t, js = run_once(rounds, live, True)
        with_l.append(t)
        t, _js = run_once(rounds, live, False)
        without.append(t)
    assert js is not None
    store = js.store.data  # type: ignore[attr-defined]
    sizes = [len(v) for v in store.values()]
    key = next(iter(store))
    st = js.load(key, js.parts[0])
    assert st is not None
    led = st.ledger
    rec = encode_ledger(led, account(led), T0)
    with_m, without_m = statistics.median(with_l), statistics.median(without)
    print(json.dumps({
        "jobs": a.jobs, "records": sum(len(r) for r in rounds), "signals": n_sigs,
        "job_stage_cpu_s": {"with_ledger": round(with_m, 3), "without (peer)": round(
            without_m, 3)},
        "us_per_signal": {"with_ledger": round(1e6 * with_m / n_sigs, 2),
                          "without (peer)": round(1e6 * without_m / n_sigs, 2)},
        "overhead": round(with_m / without_m - 1, 4),
        "stored_state_bytes_per_job": round(sum(sizes) / len(sizes)),
        "ledger_record_bytes": len(rec), "incidents": len(led.incidents),
        "attempts": len(led.attempts), "runs": {"with": with_l, "without": without},
        "python": sys.version.split()[0], "when": time.strftime("%Y-%m-%d %H:%M")}))


if __name__ == "__main__":
    main()
