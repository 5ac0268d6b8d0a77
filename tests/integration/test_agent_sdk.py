"""The training SDK through a real agent: its messages reach the logs topic as notes."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from tests.support.agents import agent_cmd, has_exit, run_agent
from tests.support.kafka import consume

pytestmark = pytest.mark.kafka

TRAIN = """
import os, time
from faultwatch import sdk
assert os.environ["FAULTWATCH_ATTEMPT"] == "0"
sdk.set_retryable_errors(["my flaky storage"])
with sdk.stage("init", hang_window_s=600):
    time.sleep(0.05)
mon = sdk.StepMonitor()
for step in range(30):
    time.sleep(0.02)
    mon.step(step, loss=1.0 / (step + 1) if step != 20 else float("nan"), lr=0.1)

@sdk.stage("eval", hang_window_s=None)
def evaluate():
    print("evaluating", flush=True)

evaluate()
sdk.notify("done training", level="info")
"""


def test_sdk_notes_reach_the_logs_topic(kafka_bootstrap: str, topic_prefix: str,
                                        tmp_path: Path) -> None:
    res = run_agent(agent_cmd(kafka_bootstrap, topic_prefix, tmp_path, "sdkjob",
                              sys.executable, "-c", TRAIN,
                              extra=("--no-follow-decisions",)))
    assert res.returncode == 0, res.stderr.decode()[-3000:]
    assert res.stdout == b"evaluating\n"
    recs = consume(kafka_bootstrap, f"{topic_prefix}logs", has_exit)
    notes = [r for r in recs if r["t"] == "note"]
    by = {k: [n["data"] for n in notes if n["kind"] == k]
          for k in ("progress", "stage", "notify", "retryable_errors")}
    assert all(n["job"] == "sdkjob" and n["node"] == "n1" and n["attempt"] == 0 for n in notes)
    assert by["retryable_errors"] == [{"rank": None, "patterns": ["my flaky storage"]}]
    assert [(s["stage"], s["opens"], s["hang_window_s"]) for s in by["stage"]] == [
        ("init", True, 600.0), ("init", False, 600.0), ("eval", True, None),
        ("eval", False, None)]
    steps = [p["step"] for p in by["progress"]]
    assert steps == sorted(steps) and steps[-1] == 29 and len(steps) >= 1
    last = by["progress"][-1]
    assert last["metrics"]["lr"] == 0.1 and last["step_time_s"] > 0.01
    msgs = [(n["level"], n["message"]) for n in by["notify"]]
    assert msgs[-1] == ("info", "done training")
    assert any(lvl == "error" and "nan" in m for lvl, m in msgs)
    # the notes precede the exit record (shipped before it, same partition)
    kinds = [r["t"] for r in recs]
    assert kinds.index("exit") > max(i for i, r in enumerate(recs) if r["t"] == "note")
