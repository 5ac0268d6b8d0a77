"""A checkpoint line names its step (the built-in stage rules' `step` group): the matcher reads
it, the signal carries it over the wire, the SDK's stage can say it, and a rule test that
expects another step fails."""

from __future__ import annotations

import functools
from pathlib import Path

from faultwatch import wire
from faultwatch.agents.sdk_server import _clean
from faultwatch.core.events import Line, Stage
from faultwatch.core.matching import signals_of_lines
from faultwatch.rules import Matcher, load_ruleset
from faultwatch.rules.selftest import run_rule_tests


@functools.cache
def matcher() -> Matcher:
    return Matcher(load_ruleset(()))


def stages(*texts: str) -> list[tuple[str, bool, int | None]]:
    lines = [Line("stdout", k, 100.0 + k, t) for k, t in enumerate(texts)]
    sigs = signals_of_lines("j", 0, "n0", lines, matcher())
    return [(s.stage, s.opens, s.step) for s in sigs if isinstance(s, Stage)]


def test_megatron_trainer_and_deepspeed_checkpoint_lines_name_their_step() -> None:
    assert stages("saving checkpoint at iteration     200 to /ckpt",
                  "  successfully saved checkpoint from iteration     200 to /ckpt",
                  "Saving model checkpoint to out/checkpoint-500",
                  "[Torch] Checkpoint global_step42 is about to be saved!",
                  "[Torch] Checkpoint global_step42 is ready now!",
                  "checkpoint saved") == [
        ("checkpoint", True, 200), ("checkpoint", False, 200), ("checkpoint", True, 500),
        ("checkpoint", True, 42), ("checkpoint", False, 42), ("checkpoint", False, None)]


def test_the_step_crosses_the_signals_topic_and_the_sdk() -> None:
    st = Stage("j", 0, "n0", 5.0, 1, "checkpoint", True, 60.0, run_id="r", step=7)
    (back,) = wire.decode_signals(wire.encode_bundle("j", [st]))  # type: ignore[misc]
    assert back == st
    plain = Stage("j", 0, "n0", 5.0, 1, "eval", True)
    assert "step" not in wire.signal_dict(plain)
    assert _clean("stage", 0, {"stage": "checkpoint", "opens": True, "hang_window_s": None,
                               "step": 12})["step"] == 12
    assert "step" not in _clean("stage", 0, {"stage": "eval", "opens": True})


def test_a_stage_rule_test_expecting_another_step_fails(tmp_path: Path) -> None:
    rules = tmp_path / "r.yaml"
    rules.write_text("""version: 1
rules:
  - id: my-save
    kind: stage
    stage: checkpoint
    opens: false
    regex: 'saved ckpt (?P<step>\\d+)'
    tests:
      match:
        - line: "saved ckpt 30"
          step: 31
""")
    (problem,) = run_rule_tests([str(rules)])
    assert "got step=30" in problem.message and "expected step=31" in problem.message
    rules.write_text(rules.read_text().replace("step: 31", "step: 30"))
    assert run_rule_tests([str(rules)]) == []  # the positive control
