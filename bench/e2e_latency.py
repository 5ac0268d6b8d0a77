"""End-to-end decision latency on real torchrun jobs, embedded and cluster mode; prints JSON.

Latency of an error decision = decision time - time of the root error line (agent clock);
it includes the settle time, which is reported beside it. Latency of a hang decision =
decision time - (start of silence + window), i.e. how late after the window it was decided.

    .venv/bin/python bench/e2e_latency.py [--bootstrap HOST:PORT] [--runs 3]
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
FW = str(Path(sys.executable).parent / "faultwatch")
JOB = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2",
       str(ROOT / "examples" / "train_gloo.py")]
SETTLE_S = 1.0
WINDOW_S = 5.0


def env(**kw: str) -> dict[str, str]:
    e = dict(os.environ, OMP_NUM_THREADS="1", PYTHONWARNINGS="ignore")
    e.update(kw)
    return e


def latency(d: dict[str, Any]) -> float:
    ev = d["evidence"]
    if d["reason"]["kind"] == "hang":
        return float(d["ts"] - (ev["silent_since"] + ev["window_s"]))
    return float(d["ts"] - ev["first_error"]["ts"])


def embedded(kind: str, tmp: Path) -> float:
    out = tmp / f"{uuid.uuid4().hex}.jsonl"
    subprocess.run([FW, "run", "--decisions-out", str(out), "--settle-s", str(SETTLE_S),
                    "--hang-window-s", str(WINDOW_S), "--max-restarts", "0",
                    "--term-grace-s", "2", "--", *JOB],
                   env=env(FW_FAULT=kind), capture_output=True, timeout=120, check=False)
    decs = [json.loads(x) for x in out.read_text().splitlines()]
    return latency(decs[0])


def cluster_decisions(bootstrap: str, prefix: str, job: str) -> list[dict[str, Any]]:
    out = subprocess.run([FW, "decisions", "--bootstrap", bootstrap, "--topic-prefix", prefix,
                          "--job", job, "--json"], capture_output=True, text=True, timeout=60)
    return [json.loads(x) for x in out.stdout.splitlines() if x.strip()]


def cluster(kind: str, bootstrap: str, prefix: str, tmp: Path) -> float:
    job = f"{kind}-{uuid.uuid4().hex[:6]}"
    agent = subprocess.Popen([FW, "agent", "--bootstrap", bootstrap, "--topic-prefix", prefix,
                              "--job", job, "--node", "n0", "--heartbeat-s", "1",
                              "--spool-dir", str(tmp / job), "--", *JOB],
                             env=env(FW_FAULT=kind), stdout=subprocess.DEVNULL,
                             stderr=subprocess.DEVNULL, start_new_session=True)
    deadline = time.time() + 90
    decs: list[dict[str, Any]] = []
    while time.time() < deadline and not decs:
        time.sleep(0.5)
        decs = cluster_decisions(bootstrap, prefix, job)
    if agent.poll() is None:
        os.killpg(agent.pid, signal.SIGTERM)
    agent.wait(30)
    if not decs:
        raise RuntimeError(f"no decision for {job}")
    return latency(decs[0])


def summary(xs: list[float]) -> dict[str, float]:
    return {"n": len(xs), "median_s": round(statistics.median(xs), 3),
            "max_s": round(max(xs), 3), "min_s": round(min(xs), 3)}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--bootstrap", default=os.environ.get("FAULTWATCH_BOOTSTRAP"))
    ap.add_argument("--runs", type=int, default=3)
    a = ap.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="fw-lat-"))
    started_broker = None
    if not a.bootstrap:
        from faultwatch.kafka import broker as kafka_broker

        port = kafka_broker.free_port()
        started_broker = (tmp / "kafka", port)
        a.bootstrap = kafka_broker.up(port, tmp / "kafka")
    prefix = f"lat{uuid.uuid4().hex[:6]}."
    result: dict[str, Any] = {"settle_s": SETTLE_S, "hang_window_s": WINDOW_S,
                              "agent_heartbeat_s": 1.0, "embedded_heartbeat_s": 0.5}
    try:
        result["embedded_error"] = summary([embedded("retryable", tmp) for _ in range(a.runs)])
        result["embedded_hang_after_window"] = summary([embedded("hang", tmp)
                                                        for _ in range(a.runs)])
        log = open(tmp / "processor.log", "wb")  # noqa: SIM115
        proc = subprocess.Popen([FW, "process", "--bootstrap", a.bootstrap, "--topic-prefix",
                                 prefix, "--partitions", "2", "--settle-s", str(SETTLE_S),
                                 "--hang-window-s", str(WINDOW_S)], stdout=log,
                                stderr=subprocess.STDOUT, start_new_session=True, env=env())
        try:
            time.sleep(3)
            result["cluster_error"] = summary([cluster("retryable", a.bootstrap, prefix, tmp)
                                               for _ in range(a.runs)])
            result["cluster_hang_after_window"] = summary([cluster("hang", a.bootstrap, prefix,
                                                                   tmp) for _ in range(a.runs)])
        finally:
            os.killpg(proc.pid, signal.SIGTERM)
            proc.wait(30)
    finally:
        if started_broker is not None:
            from faultwatch.kafka import broker as kafka_broker

            kafka_broker.down(started_broker[0], started_broker[1])
    print(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
