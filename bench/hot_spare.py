"""A hot spare against a requeue, on the same fault, under the same real Slurm; prints JSON.

A two-node torchrun job (gloo, c10d rendezvous, one rank per node, a checkpoint every step:
tests/e2e/jobs/ckpt_train.py) runs under `faultwatch agent` on a real Slurm cluster on this
machine (tests/support/slurm.py: one slurmctld, a slurmd per node n1, n2, n3), with a real
broker, `faultwatch process` and `faultwatch actuate --backend slurm`. Node n1 prints an
NVIDIA Xid 79 line at step FW_XID_STEP and hangs. Two ways to recover, side by side:

- requeue: `sbatch --requeue -N 2`; the blacklist makes n1's agent exit 138 and actuate drain
  n1 and requeue the job, which Slurm starts again on n2 and n3;
- spare: `sbatch -N 3` with `--spares 1` (n3 waits as a spare); the blacklist swaps n3 in,
  n1's agent leaves, actuate drains n1 and requeues nothing.

For each: the Xid line's time, the decision's time, the first training step after the
recovery (the job's own timeline, wall clock), the steps redone, and the seconds from the
decision to that first step (the headline) and from the last step before the fault.

    .venv/bin/python bench/hot_spare.py [--bootstrap HOST:PORT] [--runs 1] [--out FILE]

Needs root and Debian's slurm-wlm and munge (as tests/e2e/test_slurm.py). Without
--bootstrap a local broker is started (faultwatch/kafka/broker.py) and stopped.
"""

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
from contextlib import ExitStack
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests.support.cluster import decisions, processor, wait_processor_ready  # noqa: E402
from tests.support.processes import job_env, stop_group  # noqa: E402
from tests.support.slurm import SlurmCluster, missing  # noqa: E402
from tests.support.spares import free_port, torchrun_line  # noqa: E402
from tests.support.waiting import wait_until  # noqa: E402

NODES = ("n1", "n2", "n3")
PY = sys.executable

TASK = '''\
#!{python}
import os
node = os.environ["SLURMD_NODENAME"]
restart = os.environ.get("SLURM_RESTART_COUNT", "0")
env = dict(os.environ, FAULTWATCH_ATTEMPT=restart)
argv = [{python!r}, "-m", "faultwatch", "agent", "--job", {job!r}, "--node", node,
        "--heartbeat-s", "0.5", "--spare-note-s", "1", "--term-grace-s", "5",
        "--spares", {spares!r}, "--verdict-out", {tmp!r} + f"/{{node}}-{{restart}}.verdict.json",
        "--", *{torchrun!r}]
os.execve(argv[0], argv, env)
'''

BATCH = '''\
#!{python}
import os, subprocess, sys
sys.exit(subprocess.run(["srun", "--ntasks-per-node=1", {task!r}]).returncode)
'''


def _write(path: Path, text: str) -> Path:
    path.write_text(text)
    path.chmod(0o755)
    return path


def one_path(name: str, slurm: SlurmCluster, bootstrap: str, tmp: Path, steps: int,
             xid_step: int, step_s: float) -> dict[str, Any]:
    """One job through one recovery (`requeue` or `spare`); its figures."""
    spares = 1 if name == "spare" else 0
    nodes = 2 + spares
    prefix = f"hs{uuid.uuid4().hex[:8]}."
    job = f"hot-{name}-{uuid.uuid4().hex[:6]}"
    work = tmp / name
    work.mkdir(parents=True)
    timeline = work / "timeline.jsonl"
    env = slurm.env(job_env(FW_CKPT=str(work / "ckpt.json"), FW_TIMELINE=str(timeline),
                            FW_XID_NODE="n1", FW_XID_STEP=str(xid_step), FW_STEPS=str(steps),
                            FW_STEP_S=str(step_s)))
    env.update(FAULTWATCH_BOOTSTRAP=bootstrap, FAULTWATCH_TOPIC_PREFIX=prefix,
               FAULTWATCH_SPOOL_DIR=str(work / "spool"), FAULTWATCH_LOCK_DIR=str(work))
    torchrun = torchrun_line(free_port(), job)
    task = _write(work / "task.py", TASK.format(python=PY, job=job, spares=str(spares),
                                                tmp=str(work), torchrun=torchrun))
    batch = _write(work / "batch.py", BATCH.format(python=PY, task=str(task)))
    out = work / "slurm.out"
    jid = ""
    with ExitStack() as stack:
        proc = stack.enter_context(processor(bootstrap, prefix, work / "processor.log",
                                             "--settle-s", "1", "--hang-window-s", "120",
                                             env=env))
        wait_processor_ready(bootstrap, prefix, proc, work / "processor.log")
        with open(work / "actuate.log", "wb") as log:
            actuate = subprocess.Popen([PY, "-m", "faultwatch", "actuate", "--backend", "slurm",
                                        "--state-file", str(work / "actuate.jsonl"),
                                        "--group", f"{prefix}actuate"], stdout=log,
                                       stderr=subprocess.STDOUT, env=env,
                                       start_new_session=True)
        stack.callback(stop_group, actuate)
        wait_until(lambda: "actuate_started" in (work / "actuate.log").read_text(), 60,
                   "actuate started", interval_s=0.3)
        r = subprocess.run(["sbatch", "--parsable", f"-N{nodes}", "--requeue",
                            f"--job-name={job}", "--open-mode=append", f"--output={out}",
                            str(batch)], env=env, capture_output=True, text=True, timeout=30,
                           check=True)  # the job's environment: the broker, the prefix
        jid = r.stdout.strip().split(";")[0]
        stack.callback(slurm.run, "scancel", jid, check=False)
        submitted = time.time()
        info = wait_until(lambda: (lambda j: j if j.get("JobState") in (
            "COMPLETED", "FAILED", "CANCELLED", "TIMEOUT") else None)(slurm.job_info(jid)),
            900, f"{name}: the job ended", interval_s=1.0,
            detail=lambda: out.read_text()[-3000:] if out.exists() else "")
        decs = decisions(bootstrap, prefix, job)
    rows = [json.loads(x) for x in timeline.read_text().splitlines() if x.strip()]
    starts = [r["t"] for r in rows if r.get("event") == "start" and r["attempt"] >= 1]
    inits = [r["t"] for r in rows if r.get("event") == "init" and r["attempt"] >= 1]
    rows = [r for r in rows if "step" in r]
    blacklist = next(d for d in decs if d["action"] == "blacklist")
    before = [r for r in rows if r["attempt"] == 0]
    after = [r for r in rows if r["attempt"] >= 1]
    first_after = min(r["t"] for r in after)
    last_before = max(r["t"] for r in before)
    resumed_from = min(r["resumed_from"] for r in after)
    verdicts = {p.name.split(".")[0]: json.loads(p.read_text())["verdict"]
                for p in sorted(work.glob("*.verdict.json"))}
    return {
        "path": name, "nodes_allocated": nodes, "slurm_job": jid,
        "job_state": info.get("JobState"), "restarts": int(info.get("Restarts", 0) or 0),
        "node_list_end": info.get("NodeList"), "swaps": blacklist.get("swaps", []),
        "decision_to_first_step_s": round(first_after - blacklist["ts"], 2),
        # where that goes: until the next attempt's workers start (faultwatch, the scheduler,
        # the launcher's start), their rendezvous, their first step (restore included)
        "decision_to_workers_start_s": round(max(starts) - blacklist["ts"], 2),
        "workers_start_to_rendezvous_s": round(max(inits) - max(starts), 2),
        "rendezvous_to_first_step_s": round(first_after - max(inits), 2),
        "xid_to_decision_s": round(blacklist["ts"]
                                   - blacklist["evidence"]["first_error"]["ts"], 2),
        "last_step_to_first_step_s": round(first_after - last_before, 2),
        "steps_redone": max(r["step"] for r in before) + 1 - resumed_from,
        "finished_all_steps": max(r["step"] for r in after) == steps - 1,
        "submit_to_end_s": round(time.time() - submitted, 1),
        "agents": verdicts,
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--bootstrap", default=os.environ.get("FAULTWATCH_BOOTSTRAP"))
    ap.add_argument("--runs", type=int, default=1, help="jobs per path")
    ap.add_argument("--steps", type=int, default=12)
    ap.add_argument("--xid-step", type=int, default=5)
    ap.add_argument("--step-s", type=float, default=0.3)
    ap.add_argument("--out", type=Path, default=None, help="also write the JSON here")
    ap.add_argument("--keep", type=Path, default=None, help="keep logs under this directory")
    args = ap.parse_args()
    why = missing()
    if why:
        print(f"bench/hot_spare.py: {why}", file=sys.stderr)
        return 1
    from faultwatch.kafka import broker

    tmp = args.keep or Path(tempfile.mkdtemp(prefix="hot-spare-"))
    bootstrap, data = args.bootstrap, None
    if not bootstrap:
        data = tmp / "kafka"
        bootstrap = broker.up(port=broker.free_port(), data_dir=data)
    slurm = SlurmCluster(nodes=NODES, extra_conf=("RequeueExit=138",))
    runs: list[dict[str, Any]] = []
    try:
        slurm.start()
        for i in range(args.runs):
            for name in ("requeue", "spare"):
                runs.append(one_path(name, slurm, bootstrap, tmp / f"run{i}", args.steps,
                                     args.xid_step, args.step_s))
                print(json.dumps(runs[-1]), file=sys.stderr, flush=True)
                slurm.run("scontrol", "update", "nodename=n1", "state=resume", check=False)
                slurm.wait_for(slurm.all_idle, 120, "every node idle again")
    finally:
        slurm.stop()
        if data is not None:
            broker.down(data)

    def summary(name: str) -> dict[str, Any]:
        rows = [r for r in runs if r["path"] == name]
        return {"runs": len(rows),
                **{k: statistics.median(r[k] for r in rows) for k in (
                    "decision_to_first_step_s", "decision_to_workers_start_s",
                    "workers_start_to_rendezvous_s", "rendezvous_to_first_step_s",
                    "last_step_to_first_step_s", "xid_to_decision_s", "steps_redone")}}

    spare, requeue = summary("spare"), summary("requeue")
    report = {
        "bench": "hot_spare", "date": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
        "machine": {"cpus": os.cpu_count(), "load_1m": round(os.getloadavg()[0], 1)},
        "job": {"nodes_active": 2, "ranks_per_node": 1, "backend": "gloo", "steps": args.steps,
                "xid_step": args.xid_step, "step_s": args.step_s,
                "slurm": "cred_expire=10 (default 120: a requeue waits that long more)"},
        "spare": spare, "requeue": requeue,
        "speedup_decision_to_first_step": round(
            requeue["decision_to_first_step_s"] / spare["decision_to_first_step_s"], 2),
        "runs": runs,
    }
    text = json.dumps(report, indent=1)
    print(text)
    if args.out:
        args.out.write_text(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
