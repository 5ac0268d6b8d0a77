"""The hang evaluation matrix: real torchrun jobs (2 ranks, gloo, CPU, the training image
.venv-train) under `faultwatch run` (tests/e2e/jobs/hang_matrix_job.py), run side by side.
Healthy silences must end with no action; real hangs must be decided with the right culprit.
Used by tests/e2e/test_hang_matrix.py and bench/hang_matrix.py.

Short settings keep it lean: the job steps every ~0.2 s, so the learned window is about the
floor (5 s); a healthy silence lasts 20 s (4x the window: the old rule decided each of them a
hang); the ceiling is 60 s and stuck_stacks_s 12 s. torch's start-up is the costly part on a
loaded machine (6 CPU seconds a process here), so the five healthy silences share one job,
one after the other, and each hang has its own: five torchrun jobs in all."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tests.support.waiting import wait_until

ROOT = Path(__file__).resolve().parents[2]
JOB = ROOT / "tests" / "e2e" / "jobs" / "hang_matrix_job.py"
TRAIN_BIN = ROOT / ".venv-train" / "bin"
SETTINGS = {"hang_floor_s": 5.0, "hang_ceiling_s": 60.0, "stuck_stacks_s": 12.0,
            "init_window_s": 600.0}  # torch's start-up takes minutes on a loaded machine
SILENCE_S = 20.0
ACTIONS = ("restart", "fail", "blacklist")


@dataclass(frozen=True)
class Scenario:
    name: str
    expected: str  # "no action" or "hang"
    culprits: tuple[int, ...] = ()


SCENARIOS = (
    Scenario("save", "no action"),
    Scenario("upload", "no action"),
    Scenario("eval", "no action"),
    Scenario("compile", "no action"),
    Scenario("slow_data", "no action"),
    Scenario("stuck_before_collective", "hang", (1,)),
    Scenario("deadlock_one", "hang", (1,)),
    Scenario("stuck_worker", "hang", (1,)),
    Scenario("deadlock_all", "hang", (0, 1)),
)


def faultwatch_exe() -> str:
    exe = Path(sys.executable).parent / "faultwatch"
    return str(exe) if exe.exists() else "faultwatch"


@dataclass
class Run:
    """One `faultwatch run -- torchrun` job playing `scenarios` one after the other."""

    scenarios: tuple[Scenario, ...]
    tmp: Path
    needs_evidence: bool = True
    proc: subprocess.Popen[bytes] | None = None
    started: float = 0.0
    started_mono: float = 0.0
    log: Path = field(init=False)

    def __post_init__(self) -> None:
        self.tmp.mkdir(parents=True, exist_ok=True)
        self.log = self.tmp / "output.txt"

    @property
    def decisions_file(self) -> Path:
        return self.tmp / "decisions.jsonl"

    def start(self) -> None:
        out = self.tmp / "out"
        out.mkdir(exist_ok=True)
        env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONWARNINGS="ignore",
                   PYTHONPATH=str(ROOT),
                   FW_SCENARIO=",".join(s.name for s in self.scenarios),
                   FW_SILENCE_S=str(SILENCE_S), FW_MARKS=str(self.tmp / "marks.txt"))
        flags = [f"--{k.replace('_', '-')}={v:g}" for k, v in SETTINGS.items()]
        if not self.needs_evidence:  # the rule before issue 22: silence alone decides
            rules = self.tmp / "silence-alone.yaml"
            rules.write_text("version: 1\npolicy:\n  hang_needs_evidence: false\n")
            flags += ["--rules", str(rules)]
        cmd = [faultwatch_exe(), "run", *flags, "--max-restarts", "0",
               "--decisions-out", str(self.decisions_file),
               "--control-out", str(self.tmp / "control.jsonl"), "--",
               str(TRAIN_BIN / "torchrun"), "--standalone", "--nproc-per-node", "2",
               str(JOB), str(out)]
        self.started, self.started_mono = time.time(), time.monotonic()
        with self.log.open("wb") as f:
            self.proc = subprocess.Popen(cmd, env=env, stdout=f, stderr=subprocess.STDOUT,
                                         start_new_session=True)

    def decisions(self) -> list[dict[str, Any]]:
        f = self.decisions_file
        return [json.loads(x) for x in f.read_text().splitlines() if x] if f.exists() else []

    def marks(self, event: str) -> list[float]:
        f = self.tmp / "marks.txt"
        if not f.exists():
            return []
        return sorted(float(ts) for ev, _r, ts in (x.split() for x in f.read_text().splitlines())
                      if ev == event)

    def done(self) -> bool:
        return self.proc is not None and self.proc.poll() is not None

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(30)

    def results(self) -> list[dict[str, Any]]:
        """One row per scenario. A healthy silence passes with no action decided, and (the
        positive control) a notice that held a hang back during it: the silence outlasted the
        learned window. A hang passes when decided with the expected culprit."""
        decs = self.decisions()
        acted = [d for d in decs if d["action"] in ACTIONS]
        rows = []
        for sc in self.scenarios:
            began = (self.marks(f"stall:{sc.name}") or self.marks(f"silence:{sc.name}")
                     or [None])[0]
            ended = (self.marks(f"resumed:{sc.name}") or [None])[-1]
            mine = [d for d in acted if began is not None and d["ts"] >= began - 1.0
                    and (ended is None or d["ts"] <= ended + SETTINGS["hang_floor_s"])]
            first = mine[0] if mine else None
            hang = first if first is not None and first["reason"]["kind"] == "hang" else None
            held = [d for d in decs if d["reason"]["kind"] == "hang-deferred" and
                    began is not None and began - 1.0 <= d["evidence"].get("silent_since", 0)
                    and (ended is None or d["evidence"]["silent_since"] <= ended)]
            row: dict[str, Any] = {
                "scenario": sc.name, "expected": sc.expected,
                "decision": "not played" if began is None else "no action" if first is None
                else f"{first['reason']['kind']} ({first['action']})",
                "seconds_after_stall": None if first is None or began is None
                else round(first["ts"] - began, 1),
                "culprit": list(hang["targets"]["ranks"]) if hang is not None else [],
                "expected_culprit": list(sc.culprits),
                "held_notices": len(held),
                "silence_s": None if began is None or ended is None else round(ended - began, 1),
                "message": (first or (held[0] if held else {})).get("reason", {})
                .get("message", "")[:500],
            }
            if sc.expected == "no action":
                row["ok"] = began is not None and ended is not None and first is None \
                    and bool(held)
            else:
                row["ok"] = hang is not None and tuple(row["culprit"]) == sc.culprits
            rows.append(row)
        if all(s.expected == "no action" for s in self.scenarios):  # trained to its end
            for row in rows:
                row["exit_code"] = self.proc.returncode if self.proc is not None else None
                row["ok"] = row["ok"] and row["exit_code"] == 0 and not acted
        return rows

    def tail(self) -> str:
        return self.log.read_text(errors="replace")[-3000:] if self.log.exists() else ""


def jobs(scenarios: tuple[Scenario, ...], apart: bool = False) -> list[tuple[Scenario, ...]]:
    """The healthy silences in one job, each hang in a job of its own; `apart`: every
    scenario in its own job (a false hang ends a job: the silences after it would not play)."""
    healthy = tuple(s for s in scenarios if s.expected == "no action")
    if apart:
        return [(s,) for s in scenarios]
    return ([healthy] if healthy else []) + [(s,) for s in scenarios if s.expected != "no action"]


def run_matrix(tmp: Path, scenarios: tuple[Scenario, ...] = SCENARIOS,
               needs_evidence: bool = True, stagger_s: float = 3.0,
               timeout_s: float = 420.0) -> list[dict[str, Any]]:
    """Run the jobs side by side (starts `stagger_s` apart: torch imports are the CPU peak);
    a job ends when it ends or when an action was decided (then it is stopped). Returns one
    row per scenario, in the order given."""
    runs = [Run(group, tmp / "+".join(s.name for s in group), needs_evidence)
            for group in jobs(scenarios, apart=not needs_evidence)]
    started = time.monotonic()

    def launched() -> bool:  # the next job starts once the last one had stagger_s to import
        todo = [r for r in runs if r.proc is None]
        if todo and time.monotonic() - max((r.started_mono for r in runs), default=0.0) \
                >= stagger_s:
            todo[0].start()
        return all(r.proc is not None for r in runs)

    def finished() -> bool:  # a job that decided an action is stopped: the restart is moot
        for r in runs:
            if not r.done() and r.proc is not None and \
                    any(d["action"] in ACTIONS for d in r.decisions()):
                r.stop()
        return all(r.done() for r in runs)

    try:
        wait_until(launched, stagger_s * len(runs) + 30, "every job started", interval_s=0.2)
        wait_until(finished, timeout_s, "every job ended or decided", interval_s=0.5,
                   raise_on_timeout=False)
    finally:
        for r in runs:
            r.stop()
    wall = round(time.monotonic() - started, 1)
    rows = {}
    for r in runs:
        for row in r.results():
            row["job_wall_s"] = wall
            if not row["ok"]:
                row["output_tail"] = r.tail()
            rows[row["scenario"]] = row
    return [rows[s.name] for s in scenarios]


def table(results: list[dict[str, Any]]) -> str:
    """The matrix as a Markdown table."""
    rows = ["| scenario | expected | decision | s after stall | culprit | ok |",
            "| --- | --- | --- | --- | --- | --- |"]
    for r in results:
        after = "" if r["seconds_after_stall"] is None else f"{r['seconds_after_stall']:.1f}"
        culprit = ", ".join(str(x) for x in r["culprit"]) or "-"
        rows.append(f"| {r['scenario']} | {r['expected']} | {r['decision']} | {after} | "
                    f"{culprit} | {'yes' if r['ok'] else 'NO'} |")
    return "\n".join(rows)
