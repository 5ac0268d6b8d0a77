"""Real frameworks hanging under `faultwatch run` with default settings (no flags, no
faultwatch code in the job), a Hugging Face Trainer job and a Lightning job on torchrun (2
ranks, gloo, CPU, the training-image env .venv-train). One run per framework is both controls:
the job first spends a long time silent inside a checkpoint write (torch.save through a
crawling file: the main thread is in torch/serialization.py, which py-spy shows) and must not
be decided a hang; after the save rank 1 stops for good and the hang must be decided within
90 s of the stall, naming rank 1 and where it is.

The two runs overlap (they mostly wait): the Lightning job starts when the Trainer job begins
its save, so the Trainer learns its window alone and Lightning's CPU-heavy startup falls in
the Trainer's silent save; each run is stopped as soon as its hang is decided."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.support.processes import faultwatch_exe
from tests.support.waiting import wait_until

ROOT = Path(__file__).resolve().parents[2]
TRAIN_ENV = ROOT / ".venv-train" / "bin"
HF_JOB = Path(__file__).parent / "jobs" / "hf_stall.py"
LIGHTNING_JOB = Path(__file__).parent / "jobs" / "lightning_stall.py"
pytestmark = pytest.mark.slow
RERUN_WAITS_FOR_THE_OTHER_S = 180.0


def _train_bin() -> Path:
    if os.environ.get("FAULTWATCH_NO_TRAIN_ENV"):
        pytest.skip("FAULTWATCH_NO_TRAIN_ENV is set: no training-image env (.venv-train)")
    assert (TRAIN_ENV / "torchrun").exists(), "scripts/bootstrap.sh builds .venv-train"
    return TRAIN_ENV


class Run:
    """`faultwatch run -- torchrun ... job` with its decisions file and the job's marks."""

    def __init__(self, tmp: Path, job: Path, **fault: str):
        self.decisions = tmp / "decisions.jsonl"
        self.control = tmp / "control.jsonl"  # the probes: never among the decisions
        self.marks = tmp / "marks.txt"
        env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONWARNINGS="ignore",
                   HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", FW_MARKS=str(self.marks),
                   PYTHONPATH=str(ROOT), **fault)
        cmd = [faultwatch_exe(), "run", "--decisions-out", str(self.decisions),
               "--control-out", str(self.control), "--",
               str(_train_bin() / "torchrun"), "--standalone", "--nproc-per-node", "2",
               str(job), str(tmp / "out")]
        self.proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE,
                                     stderr=subprocess.STDOUT, start_new_session=True)
        self.output: list[bytes] = []
        self._stopping = threading.Lock()
        threading.Thread(target=self._read, daemon=True).start()
        threading.Thread(target=self._stop_once_hang_decided, daemon=True).start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for chunk in iter(lambda: self.proc.stdout.read1(65536), b""):  # type: ignore[union-attr]
            self.output.append(chunk)

    def tail(self) -> str:
        return b"".join(self.output)[-4000:].decode(errors="replace").replace("\r", "\n")

    def marks_of(self, event: str) -> list[float]:
        if not self.marks.exists():
            return []
        return [float(ts) for ev, _rank, ts in (x.split() for x in
                                                self.marks.read_text().splitlines())
                if ev == event]

    def mark(self, event: str) -> float | None:
        got = self.marks_of(event)
        return got[0] if got else None

    def decided(self) -> list[dict[str, Any]]:
        """The decisions and the probes (control channel), in time order."""
        got = [json.loads(x) for f in (self.decisions, self.control) if f.exists()
               for x in f.read_text().splitlines() if x]
        return sorted(got, key=lambda d: d["ts"])

    def wait(self, what: str, pred: Any, timeout_s: float) -> Any:
        def probe() -> Any:
            got = pred()
            if not got and self.proc.poll() is not None:
                raise AssertionError(f"no {what}: faultwatch exited; {self.report()}")
            return got

        return wait_until(probe, timeout_s, what, interval_s=0.5, detail=self.report)

    def report(self) -> str:
        kinds = [d["reason"]["kind"] for d in self.decided()]
        return f"decisions {kinds}; output:\n{self.tail()}"

    def hang(self) -> dict[str, Any] | None:
        return next((d for d in self.decided() if d["reason"]["kind"] == "hang"), None)

    def stop(self) -> None:
        """SIGTERM faultwatch: it stops the job (torchrun stops its ranks, which live in
        sessions of their own: a SIGKILL of our group would leave them behind)."""
        with self._stopping:
            if self.proc.poll() is None:
                os.killpg(self.proc.pid, signal.SIGTERM)
                try:
                    self.proc.wait(30)
                except subprocess.TimeoutExpired:
                    os.killpg(self.proc.pid, signal.SIGKILL)
                    self.proc.wait(30)

    def _stop_once_hang_decided(self) -> None:
        """Everything the tests assert is written by the hang decision; the restart that
        follows it would only load the machine under the other framework's run."""
        # a daemon thread that lives as long as the run: no deadline of its own
        decided = wait_until(lambda: self.hang() or self.proc.poll() is not None, 24 * 3600,
                             "a hang decision or the end of faultwatch", interval_s=0.5)
        if decided is not True:  # the hang decision, faultwatch still running
            self.stop()


class Runs:
    """The module's two framework runs, overlapped: the Trainer job starts at once, the
    Lightning job when the Trainer job begins its save (or has ended, or after 300 s).
    `take` hands each test its run; a test taking its run again (a rerun) gets a fresh one
    of its own."""

    def __init__(self, tmp: pytest.TempPathFactory, wanted: set[str]):
        self.tmp = tmp
        self.runs: dict[str, Run] = {}
        self.taken: set[str] = set()
        self._lock = threading.Lock()  # a rerun's replacement is atomic for the starter
        self._closing = threading.Event()
        self._lightning_started = threading.Event()
        if "trainer" in wanted:
            self.runs["trainer"] = self.start("trainer")
        if "lightning" in wanted:
            threading.Thread(target=self._start_lightning_at_the_trainer_save,
                             daemon=True).start()

    def start(self, name: str) -> Run:
        job, fault = FRAMEWORK_RUNS[name]
        return Run(self.tmp.mktemp(name), job, **fault)

    def _start_lightning_at_the_trainer_save(self) -> None:
        deadline = time.monotonic() + 300
        while not self._closing.wait(0.5):
            with self._lock:  # the current Trainer run (a rerun replaces a failed one)
                trainer = self.runs.get("trainer")
                if (trainer is None or trainer.mark("save") or trainer.proc.poll() is not None
                        or time.monotonic() > deadline):
                    self.runs["lightning"] = self.start("lightning")
                    break
        self._lightning_started.set()

    def take(self, name: str) -> Run:
        with self._lock:
            if name in self.taken:  # a rerun: alone, once the other run has decided (or later)
                self.runs[name].stop()
                for other in list(self.runs.values()):
                    try:
                        other.proc.wait(RERUN_WAITS_FOR_THE_OTHER_S)
                    except subprocess.TimeoutExpired:
                        pass
                self.runs[name] = self.start(name)
            self.taken.add(name)
        if name == "lightning":
            self._lightning_started.wait(330)
        assert name in self.runs, f"the {name} run was never started"
        return self.runs[name]

    def stop(self) -> None:
        self._closing.set()
        for run in list(self.runs.values()):
            run.stop()


def _no_hang_during_the_save(run: Run, save_s: float) -> tuple[float, float]:
    """Wait for the save to begin and end (rank 0's marks); no hang decision before its end.
    Returns (save began, save ended)."""
    began = run.wait("save mark", lambda: run.mark("save"), 300)
    run.wait("saved mark or hang decision", lambda: run.mark("saved") or run.hang(),
             save_s + 120)
    ended = run.mark("saved") or float("inf")
    early = [d for d in run.decided() if d["reason"]["kind"] == "hang" and d["ts"] <= ended]
    assert not early, f"hang decided during the save: {early[0]['reason']['message']}"
    return began, ended


def _hang_naming_rank_1(run: Run, job_file: str, func: str) -> tuple[dict[str, Any], float]:
    stalled = run.wait("stall mark", lambda: run.mark("stall"), 300)
    hang = run.wait("hang decision", run.hang, 120)
    latency = hang["ts"] - stalled
    print(f"hang decided {latency:.1f}s after the stall: {hang['reason']['message']}")
    assert latency <= 90.0, hang["reason"]["message"]
    assert hang["targets"]["ranks"] == [1], hang["reason"]["message"]
    ev = hang["evidence"]
    assert ev["culprit_basis"] in ("stacks", "flight recorder"), ev
    assert f"rank 1 is at {job_file}:" in hang["reason"]["message"]
    assert func in hang["reason"]["message"]
    stacks = ev["diagnosis"]["stacks"]["ranks"]
    assert stacks["0"]["state"] == "collective" and stacks["1"]["state"] == "elsewhere"
    return hang, latency


# Trainer: tqdm and the log dicts teach a window of a few tens of seconds (floor 30 s) in its
# first steps; on 2 busy cores it may still be the 600 s ceiling when the save comes at step
# 40. The save lasts HF_SAVE_S: at least 3x a learned window in effect then (the window
# expires inside it and a `hang-deferred` says so), or, with nothing learned, longer than the
# stacks take to decide a stuck job (unchanged over 30 s between probes at 15, 30, 60 s of
# silence: by ~60 s). Then output resumes, rank 1 stalls at step 50 and the window or the
# unchanged stacks decide (seen: 50-65 s after the stall).
HF_SAVE_S = 100.0
STACKS_DECIDE_BY_S = 60.0  # 2 x hang_floor_s: the probes that can show 30 s of unchanged stacks


@pytest.mark.timeout(600)  # startup (30-90 s on 2 busy cores) + save + stall + decision
def test_trainer_silent_save_is_no_hang_then_a_stuck_rank_is_one_naming_rank_1(runs: Runs
                                                                               ) -> None:
    run = runs.take("trainer")
    try:
        began, ended = _no_hang_during_the_save(run, HF_SAVE_S)
        # the requests made during the save: the stacks were looked at, and they carry the
        # window then in effect (the save's own gaps may lengthen the one learned afterwards)
        during = [d for d in run.decided()
                  if d["reason"]["kind"] == "diagnose" and began < d["ts"] < ended]
        assert len(during) >= 2, run.decided()
        window_s = max(d["evidence"]["window_s"] for d in during)
        if window_s < 600.0:  # learned before the save: it ran out inside the save
            assert ended - began >= 3 * window_s, (ended - began, window_s)
            deferred = [d for d in run.decided() if d["reason"]["kind"] == "hang-deferred"]
            assert deferred and began < deferred[0]["ts"] < ended, run.decided()
        else:
            assert ended - began > STACKS_DECIDE_BY_S + 15.0, (ended - began)
        hang, _ = _hang_naming_rank_1(run, "hf_stall.py", "on_step_end")
        ev = hang["evidence"]
        assert ev["window"]["basis"] == "adaptive" or "stacks_unchanged" in ev, ev["window"]
        asked = [d for d in run.decided() if d["reason"]["kind"] == "diagnose"]
        assert asked and asked[-1]["ts"] < hang["ts"]
    finally:
        run.stop()


# Lightning 2.6 picks its rich progress bar when rich is installed, and rich draws nothing
# while the output is no terminal: the job is silent from its model summary on, nothing is
# learned (window: the 600 s ceiling) and the stacks decide. Probes capture them at 15 s of
# silence and every 30 s (hang_floor_s) after; stacks unchanged across captures 30 s apart
# with rank 1 idle outside the collective rank 0 waits in (Lightning's per-step broadcast)
# decide, so a stall is decided 30-65 s after it. The save (rank 0 in torch.save, rank 1 in
# Lightning's barrier, stacks unchanged throughout) lasts LIGHTNING_SAVE_S, longer than that:
# without the checkpoint exemption the probes would decide a hang inside it.
LIGHTNING_SAVE_S = 80.0
FRAMEWORK_RUNS: dict[str, tuple[Path, dict[str, str]]] = {
    "trainer": (HF_JOB, {"FW_SAVE_AT": "40", "FW_SAVE_S": str(HF_SAVE_S), "FW_STALL_AT": "50",
                         "FW_RANK": "1"}),
    "lightning": (LIGHTNING_JOB, {"FW_SAVE_AT": "10", "FW_SAVE_S": str(LIGHTNING_SAVE_S),
                                  "FW_STALL_AT": "15", "FW_RANK": "1"}),
}


@pytest.fixture(scope="module")
def runs(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
         ) -> Iterator[Runs]:
    """The framework runs the selected tests need, overlapped (see Runs); all stopped at the
    end."""
    _train_bin()
    wanted = {name for name in FRAMEWORK_RUNS
              if any(item.name.startswith(f"test_{name}_") for item in request.session.items)}
    both = Runs(tmp_path_factory, wanted)
    try:
        yield both
    finally:
        both.stop()


@pytest.mark.timeout(600)
def test_lightning_silent_save_is_no_hang_then_a_stuck_rank_is_one_naming_rank_1(
        runs: Runs) -> None:
    run = runs.take("lightning")
    try:
        began, ended = _no_hang_during_the_save(run, LIGHTNING_SAVE_S)
        probes = [d for d in run.decided() if d["reason"]["kind"] == "diagnose"
                  and began < d["ts"] < ended]
        assert len(probes) >= 2, run.decided()  # the stacks were looked at during the save
        hang, latency = _hang_naming_rank_1(run, "lightning_stall.py", "on_train_batch_end")
        ev = hang["evidence"]
        assert ev["window"]["basis"] == "adaptive" or "stacks_unchanged" in ev, ev["window"]
        assert ended - began > latency  # the save was longer than a real stall takes
    finally:
        run.stop()
