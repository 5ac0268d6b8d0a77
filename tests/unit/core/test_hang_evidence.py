"""A learned window decides a hang only on evidence that ranks wait for each other
(docs/hangs.md): a rank in a collective while the ranks it waits for sit blocked elsewhere,
Flight Recorder entries that disagree, every rank in a collective with unchanged stacks. A
silence with every rank working outside communication (on CPU, in I/O, compiling) is a notice
and waits for the ceiling; every rank blocked at an unchanged stack decides after
stuck_stacks_s. Pure: time passed in, the agents' answers built by hand."""

from __future__ import annotations

import json
from typing import Any

from faultwatch.core.events import Heartbeat, Notice, Output, Progress, RunStart, TailLine
from faultwatch.core.job import JobState, apply
from faultwatch.core.policy import Policy

# floor 10 s: a job stepping every second learns a 10 s window; ceiling 120 s, stuck 40 s
P = Policy(hang_floor_s=10, hang_ceiling_s=120, stuck_stacks_s=40, settle_s=0,
           max_restarts=10)


def stack(state: str, at: str, idle: bool | None = True, op: str | None = None,
          **more: Any) -> dict[str, Any]:
    return {"state": state, "op": op, "at": at, "frames": [at], "idle": idle, **more}


COLL = stack("collective", "train.py:40 in step", op="all_reduce")
SLEEP = stack("elsewhere", "train.py:42 in on_step_end")
BURN = stack("elsewhere", "train.py:70 in evaluate", idle=False)
UPLOAD = stack("io", "ckpt.py:12 in upload", op="send")
AGENT = ("fr", "cpu_s", "cpu_frac", "proc_state", "workers_running")  # beside the digest
COMPILE = stack("compile", "eval_frame.py:600 in _fn", idle=False, op="_fn")


def learned(policy: Policy = P) -> tuple[JobState, float]:
    """A 2-rank job that printed a step a second for 30 s: window learned (the floor)."""
    st, _ = apply(JobState(job="j"), RunStart("j", 0, "n0", 100.0, world_size=2), 100.0, policy)
    t = 101.0
    for step in range(30):
        t = 101.0 + step
        st, decs = apply(st, Output("j", 0, "n0", t, 1, ((0, t),), (TailLine(0, t, "x"),)), t,
                         policy)
        assert decs == []
        st, decs = apply(st, Progress("j", 0, "n0", t, 0, step, source="log"), t, policy)
        assert decs == []
    return st, t


class Job:
    """Beat every second from the silence's start; answer each `diagnose` request with the
    next of `answers` (rank -> stack digest plus agent fields), repeating the last."""

    def __init__(self, answers: list[dict[int, dict[str, Any]]], policy: Policy = P,
                 delay_s: float = 0.5):
        self.policy, self.delay_s = policy, delay_s
        self.due: list[tuple[float, str]] = []
        self.st, self.last = learned(policy)
        self.answers = answers
        self.asked = 0
        self.decisions: list[Any] = []

    def run(self, for_s: float) -> Any:
        """The hang decision within for_s of silence, or None."""
        t = self.last
        while t < self.last + for_s:
            t += 1.0
            self.st, decs = apply(self.st, Heartbeat("j", 0, "n0", t, True, self.last), t,
                                  self.policy)
            self.decisions += decs
            for d in decs:
                if d.kind == "hang":
                    return d
                if d.kind == "diagnose":
                    self.due.append((t + self.delay_s, d.id))
            while self.due and self.due[0][0] <= t + 0.5:
                ts, request = self.due.pop(0)
                self._answer(request, max(ts, t + 0.5))
        return None

    def _answer(self, request: str, ts: float) -> None:
        ranks = self.answers[min(self.asked, len(self.answers) - 1)]
        self.asked += 1
        data = {"request": request, "ranks": {
            str(r): {"source": "py-spy", "cpu_s": 5.0, **{k: v for k, v in d.items()
                                                          if k in AGENT},
                     "stack": {k: v for k, v in d.items() if k not in AGENT}}
            for r, d in ranks.items()}}
        self.st, decs = apply(self.st, Notice("j", 0, "n0", ts, "diagnosis", data), ts,
                              self.policy)
        assert decs == []

    def kinds(self) -> list[str]:
        return [d.kind for d in self.decisions if d.kind != "diagnose"]

    def held(self) -> Any:
        return next(d for d in self.decisions if d.kind == "hang-deferred")


def test_a_rank_in_a_collective_waiting_for_a_blocked_rank_is_decided_at_the_window() -> None:
    job = Job([{0: COLL, 1: SLEEP}])
    hang = job.run(60)
    assert hang is not None and hang.ranks == (1,)
    assert 10.0 <= hang.ts - job.last <= 12.0, hang.ts - job.last
    assert hang.evidence["window"]["basis"] == "adaptive"
    assert hang.evidence["wait_evidence"]["kind"] == "wait"
    assert "rank 0 in all_reduce; rank 1 is at train.py:42 in on_step_end" in hang.message


def test_the_issue_s_trainer_45_s_silent_in_user_code_on_cpu_is_no_hang() -> None:
    """Issue 22: ranks 45 s silent in user code, no collective: decided a hang at the 30 s
    learned window before. Now a notice naming what each rank does, and no hang."""
    job = Job([{0: BURN, 1: BURN}])
    assert job.run(45) is None
    assert job.kinds() == ["hang-deferred"]
    held = job.held()
    assert held.action == "notify"
    assert "no rank waits for another: rank 0 at train.py:70 in evaluate (in user code, on " \
           "CPU); rank 1 at train.py:70 in evaluate (in user code, on CPU)" in held.message
    assert held.evidence["why"] == "no evidence that ranks wait for each other"
    assert held.evidence["extended_until"] == job.last + 120.0


def test_working_silences_wait_for_the_ceiling_then_say_why_they_decided() -> None:
    for ranks in ({0: BURN, 1: BURN}, {0: COMPILE, 1: COMPILE}, {0: UPLOAD, 1: COLL},
                  {0: COLL, 1: BURN}):
        job = Job([ranks])
        hang = job.run(200)
        assert hang is not None, ranks
        assert 120.0 <= hang.ts - job.last <= 122.0, (ranks, hang.ts - job.last)
        assert "the ceiling (120s) passed with no evidence that ranks wait for each other" \
            in hang.message
        assert job.kinds() == ["hang-deferred", "hang"]


def test_a_culprit_using_cpu_or_running_is_working_not_stuck() -> None:
    for agent in ({"cpu_frac": 0.6}, {"proc_state": "R"}, {"proc_state": "D"},
                  {"workers_running": 1}):
        job = Job([{0: COLL, 1: {**SLEEP, **agent}}])
        assert job.run(60) is None, agent
        assert "ranks wait for rank 1, which works" in job.held().message
    # captured off CPU each time, but it used CPU between the captures: it computes
    job = Job([{0: COLL, 1: {**SLEEP, "cpu_frac": 0.6 if i == 0 else 0.0, "cpu_s": 5.0 + 5 * i}}
               for i in range(30)])
    hang = job.run(200)
    assert hang is not None and hang.ts - job.last >= 120.0
    assert "of a core between captures" in hang.message


def test_a_background_thread_uploading_makes_a_waiting_main_thread_work() -> None:
    join = {**SLEEP, "others": ["upload: io in send at client.py:1200 in send"]}
    job = Job([{0: COLL, 1: join}])
    assert job.run(60) is None
    assert "thread upload: io in send" in job.held().message


def test_every_rank_blocked_at_an_unchanged_stack_is_a_deadlock_after_stuck_stacks_s() -> None:
    job = Job([{0: SLEEP, 1: SLEEP}])
    hang = job.run(200)
    assert hang is not None and hang.ranks == (0, 1)
    since = hang.ts - job.last
    assert 40.0 <= since < 120.0, since  # stuck_stacks_s of unchanged captures, before the ceiling
    assert hang.evidence["wait_evidence"]["kind"] == "stuck"
    assert hang.evidence["culprit_basis"] == "stacks unchanged"
    assert "every rank blocked at an unchanged stack for" in hang.message
    assert job.kinds() == ["hang-deferred", "hang"]


def test_a_changing_stack_or_io_is_never_stuck() -> None:
    moved = [{0: SLEEP, 1: stack("elsewhere", f"train.py:{50 + i} in loop")} for i in range(30)]
    job = Job(moved)
    hang = job.run(200)
    assert hang is not None and hang.ts - job.last >= 120.0  # the ceiling, not stuck_stacks_s
    job = Job([{0: UPLOAD, 1: UPLOAD}])
    hang = job.run(200)
    assert hang is not None and hang.ts - job.last >= 120.0


def test_every_rank_in_a_collective_needs_two_unchanged_captures() -> None:
    job = Job([{0: COLL, 1: COLL}])
    hang = job.run(200)
    assert hang is not None
    since = hang.ts - job.last
    assert 10.0 < since < 40.0, since  # the second capture, not the ceiling
    assert hang.evidence["wait_evidence"]["by"] == "every rank in a collective"


def test_flight_recorder_entries_that_disagree_are_evidence() -> None:
    def fr(op: str) -> str:
        return json.dumps({"entries": [{"collective_seq_id": 3, "profiling_name": f"gloo:{op}",
                                        "process_group": ["0", "default_pg"],
                                        "input_sizes": [[4]], "input_dtypes": ["Float"],
                                        "state": "scheduled"}],
                           "pg_status": {"0": {"last_enqueued_collective": 3,
                                               "last_completed_collective": 2}}})
    job = Job([{0: {**COLL, "fr": fr("all_reduce")},
                1: {**stack("collective", "train.py:41 in step", op="broadcast"),
                    "fr": fr("broadcast")}}])
    hang = job.run(60)
    assert hang is not None and hang.ts - job.last <= 12.0
    assert hang.evidence["wait_evidence"]["by"] == "flight recorder mismatch"


def test_no_answers_hold_to_the_ceiling_and_the_fixed_window_still_decides_on_silence() -> None:
    job = Job([{}])  # the agent captured nothing (no py-spy, no SDK)
    hang = job.run(200)
    assert hang is not None and hang.ts - job.last >= 120.0
    assert "no rank's stack was captured" in job.held().message
    fixed = Policy(hang_window_s=10, hang_ceiling_s=120, settle_s=0)
    job = Job([{0: BURN, 1: BURN}], policy=fixed)
    hang = job.run(60)
    assert hang is not None and hang.ts - job.last <= 11.0  # the user's own window


def test_the_switch_restores_silence_alone() -> None:
    job = Job([{0: BURN, 1: BURN}], policy=Policy(hang_floor_s=10, hang_ceiling_s=120,
                                                    settle_s=0, hang_needs_evidence=False))
    hang = job.run(60)
    assert hang is not None and hang.ts - job.last <= 11.0


def test_a_held_silence_teaches_the_window_nothing() -> None:
    job = Job([{0: BURN, 1: BURN}])
    assert job.run(50) is None
    t = job.last + 50.5
    st, decs = apply(job.st, Output("j", 0, "n0", t, 1, ((0, t),), (TailLine(0, t, "y"),)), t,
                     P)
    assert decs == []
    hist = st.hists.get("")
    assert hist is not None and (hist.max() or 0.0) < 10.0, hist


def test_the_notice_waits_for_answers_still_coming() -> None:
    """Answers that come late (py-spy on a loaded node) are waited for: no notice saying no
    stack was captured, then the hang they prove."""
    job = Job([{0: COLL, 1: SLEEP}], delay_s=8.0)
    hang = job.run(60)
    assert hang is not None and hang.ranks == (1,)
    assert job.kinds() == ["hang"]


def test_ranks_whose_loader_workers_run_are_loading_not_deadlocked() -> None:
    """A slow dataset: every main thread blocked in the loader, the workers decoding (on CPU,
    even with little CPU on a loaded machine): no stuck deadlock, only the ceiling."""
    loading = stack("data", "train.py:90 in <module>", op="_try_get_data",
                    workers_running=1, cpu_frac=0.02)
    job = Job([{0: loading, 1: loading}])
    hang = job.run(200)
    assert hang is not None and hang.ts - job.last >= 120.0
    assert "1 worker process(es) on CPU or in I/O" in job.held().message
