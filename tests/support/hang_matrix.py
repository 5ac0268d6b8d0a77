"""The hang evaluation matrix: real torchrun jobs (2 ranks, gloo, CPU, the training image
.venv-train) under `faultwatch run`, run side by side. Healthy silences must end with no
action; real hangs must be decided with the right culprit. Used by
tests/e2e/test_hang_matrix.py and bench/hang_matrix.py.

Three frameworks (the `framework` axis):
- plain: a DDP loop printing a step line (tests/e2e/jobs/hang_matrix_job.py);
- trainer: a Hugging Face Trainer, its tqdm bar and loss dicts, the scenarios played from a
  TrainerCallback and the datasets (tests/e2e/jobs/hang_matrix_trainer.py);
- lightning: a Lightning Trainer with its default rich bar, which prints nothing off a
  terminal, so nothing is learned and only the stacks can decide; the scenarios played from
  a Callback, the validation step and the dataset (tests/e2e/jobs/hang_matrix_lightning.py).

Short settings keep it lean: the jobs step every ~0.2-0.4 s, so the learned window is about
the floor (5 s); a healthy silence lasts 20 s (4x the window: the old rule decided each of
them a hang); the ceiling is 60 s (600 s for the silent Lightning job: its whole run is one
silence) and stuck_stacks_s 12 s. torch's start-up is the costly part on a loaded machine
(6-10 CPU seconds a process here), so the healthy silences of a framework share one job, one
after the other: plain has its hangs in jobs of their own, trainer and lightning end their
one job with a rank stuck before a collective. Seven torchrun jobs in all."""

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
class Framework:
    """How a framework's job is run and what proves that a healthy silence was looked at."""

    name: str
    job: Path
    settings: dict[str, float] = field(default_factory=dict)  # over SETTINGS
    # "held": the silence outlasted the learned window and a `hang-deferred` notice held
    # the hang back; "probed": nothing is learned (a silent job), so the stacks were
    # captured during the silence (diagnose probes) and decided nothing
    control: str = "held"


FRAMEWORKS = {
    "plain": Framework("plain", JOB),
    "trainer": Framework("trainer", ROOT / "tests" / "e2e" / "jobs" / "hang_matrix_trainer.py"),
    "lightning": Framework("lightning", ROOT / "tests" / "e2e" / "jobs" /
                           "hang_matrix_lightning.py", {"hang_ceiling_s": 600.0}, "probed"),
}


@dataclass(frozen=True)
class Scenario:
    name: str
    expected: str  # "no action" or "hang"
    culprits: tuple[int, ...] = ()
    framework: str = "plain"
    where: str = ""  # a hang's message names the culprit's function

    @property
    def key(self) -> str:
        return self.name if self.framework == "plain" else f"{self.framework}:{self.name}"


HEALTHY = ("save", "upload", "eval", "compile", "slow_data")
SCENARIOS = (
    *(Scenario(name, "no action") for name in HEALTHY),
    Scenario("stuck_before_collective", "hang", (1,)),
    Scenario("deadlock_one", "hang", (1,)),
    Scenario("stuck_worker", "hang", (1,)),
    Scenario("deadlock_all", "hang", (0, 1)),
    *(Scenario(name, "no action", framework="trainer") for name in HEALTHY),
    Scenario("stuck_before_collective", "hang", (1,), "trainer", "on_step_end"),
    *(Scenario(name, "no action", framework="lightning") for name in HEALTHY),
    Scenario("stuck_before_collective", "hang", (1,), "lightning", "on_train_batch_end"),
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
        self.framework = FRAMEWORKS[self.scenarios[0].framework]
        self.settings = {**SETTINGS, **self.framework.settings}

    @property
    def decisions_file(self) -> Path:
        return self.tmp / "decisions.jsonl"

    def start(self) -> None:
        out = self.tmp / "out"
        out.mkdir(exist_ok=True)
        env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONWARNINGS="ignore",
                   PYTHONPATH=str(ROOT), HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1",
                   FW_SCENARIO=",".join(s.name for s in self.scenarios),
                   FW_SILENCE_S=str(SILENCE_S), FW_MARKS=str(self.tmp / "marks.txt"))
        flags = [f"--{k.replace('_', '-')}={v:g}" for k, v in self.settings.items()]
        if not self.needs_evidence:  # the rule before issue 22: silence alone decides
            rules = self.tmp / "silence-alone.yaml"
            rules.write_text("version: 1\npolicy:\n  hang_needs_evidence: false\n")
            flags += ["--rules", str(rules)]
        cmd = [faultwatch_exe(), "run", *flags, "--max-restarts", "0",
               "--decisions-out", str(self.decisions_file),
               "--control-out", str(self.tmp / "control.jsonl"), "--",
               str(TRAIN_BIN / "torchrun"), "--standalone", "--nproc-per-node", "2",
               str(self.framework.job), str(out)]
        self.started, self.started_mono = time.time(), time.monotonic()
        with self.log.open("wb") as f:
            self.proc = subprocess.Popen(cmd, env=env, stdout=f, stderr=subprocess.STDOUT,
                                         start_new_session=True)

    def decisions(self) -> list[dict[str, Any]]:
        f = self.decisions_file
        return [json.loads(x) for x in f.read_text().splitlines() if x] if f.exists() else []

    def probes(self) -> list[dict[str, Any]]:
        """The `diagnose` requests (the control channel): when the stacks were captured."""
        f = self.tmp / "control.jsonl"
        got = [json.loads(x) for x in f.read_text().splitlines() if x] if f.exists() else []
        return [d for d in got if d["reason"]["kind"] == "diagnose"]

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
        """One row per scenario. A healthy silence passes with no action decided and its
        positive control: a notice that held a hang back during it (the silence outlasted
        the learned window), or, in a job that learns nothing, the stacks captured during it.
        In a job that ends with a hang, no action may come before the stall either. A hang
        passes when decided with the expected culprit (and, where given, its function)."""
        decs = self.decisions()
        acted = [d for d in decs if d["action"] in ACTIONS]
        probes = self.probes()
        floor = self.settings["hang_floor_s"]
        stalls = [t for s in self.scenarios if s.expected == "hang"
                  for t in self.marks(f"stall:{s.name}")[:1]]
        early = [d for d in acted if stalls and d["ts"] < min(stalls) - 1.0]
        rows = []
        for sc in self.scenarios:
            began = (self.marks(f"stall:{sc.name}") or self.marks(f"silence:{sc.name}")
                     or [None])[0]
            ended = (self.marks(f"resumed:{sc.name}") or [None])[-1]
            mine = [d for d in acted if began is not None and d["ts"] >= began - 1.0
                    and (ended is None or d["ts"] <= ended + floor)]
            first = mine[0] if mine else None
            hang = first if first is not None and first["reason"]["kind"] == "hang" else None
            held = [d for d in decs if d["reason"]["kind"] == "hang-deferred" and
                    began is not None and began - 1.0 <= d["evidence"].get("silent_since", 0)
                    and (ended is None or d["evidence"]["silent_since"] <= ended)]
            looked = [d for d in probes if began is not None and ended is not None
                      and began <= d["ts"] <= ended]
            ev = hang["evidence"] if hang is not None else {}
            row: dict[str, Any] = {
                "framework": sc.framework, "scenario": sc.name, "key": sc.key,
                "expected": sc.expected,
                "decision": "not played" if began is None else "no action" if first is None
                else f"{first['reason']['kind']} ({first['action']})",
                "seconds_after_stall": None if first is None or began is None
                else round(first["ts"] - began, 1),
                "culprit": list(hang["targets"]["ranks"]) if hang is not None else [],
                "expected_culprit": list(sc.culprits),
                "culprit_basis": ev.get("culprit_basis"),
                "window_basis": ev.get("window", {}).get("basis"),
                "stacks_unchanged": "stacks_unchanged" in ev,
                "states": {r: x.get("state") for r, x in ev.get("diagnosis", {})
                           .get("stacks", {}).get("ranks", {}).items()},
                "held_notices": len(held),
                "probes": len(looked),
                "silence_s": None if began is None or ended is None else round(ended - began, 1),
                "message": (first or (held[0] if held else {})).get("reason", {})
                .get("message", "")[:500],
            }
            if sc.expected == "no action":
                control = bool(held) if self.framework.control == "held" else bool(looked)
                row["ok"] = began is not None and ended is not None and first is None \
                    and control and not early
                if early:
                    row["early_action"] = early[0]["reason"].get("message", "")[:500]
            else:
                row["ok"] = hang is not None and tuple(row["culprit"]) == sc.culprits \
                    and (not sc.where or f"in {sc.where}" in row["message"]
                         or f".{sc.where}" in row["message"])
            rows.append(row)
        if all(s.expected == "no action" for s in self.scenarios):  # trained to its end
            for row in rows:
                row["exit_code"] = self.proc.returncode if self.proc is not None else None
                row["ok"] = row["ok"] and row["exit_code"] == 0 and not acted
        return rows

    def tail(self) -> str:
        return self.log.read_text(errors="replace")[-3000:] if self.log.exists() else ""


def jobs(scenarios: tuple[Scenario, ...], apart: bool = False) -> list[tuple[Scenario, ...]]:
    """Plain: the healthy silences in one job, each hang in a job of its own. A framework:
    one job, its healthy silences then its hang (one start-up: the costly part). `apart`:
    every scenario in its own job (a false hang ends a job: the silences after it would not
    play). The frameworks' jobs come first (their start-up is the longest)."""
    if apart:
        return [(s,) for s in scenarios]
    out: list[tuple[Scenario, ...]] = []
    for fw in sorted({s.framework for s in scenarios}, key=lambda f: f == "plain"):
        mine = [s for s in scenarios if s.framework == fw]
        healthy = tuple(s for s in mine if s.expected == "no action")
        hangs = tuple(s for s in mine if s.expected != "no action")
        if fw != "plain":
            out.append(healthy + hangs)
        else:
            out += ([healthy] if healthy else []) + [(s,) for s in hangs]
    return out


def run_matrix(tmp: Path, scenarios: tuple[Scenario, ...] = SCENARIOS,
               needs_evidence: bool = True, stagger_s: float = 3.0,
               timeout_s: float = 600.0) -> list[dict[str, Any]]:
    """Run the jobs side by side (starts `stagger_s` apart: torch imports are the CPU peak);
    a job ends when it ends or when an action was decided (then it is stopped). Returns one
    row per scenario, in the order given."""
    runs = [Run(group, tmp / f"{group[0].framework}-{len(group)}-{group[0].name}",
                needs_evidence)
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
            rows[row["key"]] = row
    return [rows[s.key] for s in scenarios]


def table(results: list[dict[str, Any]]) -> str:
    """The matrix as a Markdown table."""
    rows = ["| framework | scenario | expected | decision | s after stall | culprit | ok |",
            "| --- | --- | --- | --- | --- | --- | --- |"]
    for r in results:
        after = "" if r["seconds_after_stall"] is None else f"{r['seconds_after_stall']:.1f}"
        culprit = ", ".join(str(x) for x in r["culprit"]) or "-"
        rows.append(f"| {r['framework']} | {r['scenario']} | {r['expected']} | "
                    f"{r['decision']} | {after} | {culprit} | {'yes' if r['ok'] else 'NO'} |")
    return "\n".join(rows)
