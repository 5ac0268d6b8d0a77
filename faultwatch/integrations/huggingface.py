"""A Hugging Face `TrainerCallback` reporting steps, evaluation and saves to faultwatch."""

from __future__ import annotations

import math
import time
from typing import Any

from transformers import TrainerCallback  # type: ignore[import-not-found,unused-ignore]

from faultwatch import sdk
from faultwatch.integrations.stages import StageTracker

EVAL, CHECKPOINT = "eval", "checkpoint"


class FaultwatchCallback(TrainerCallback):  # type: ignore[misc,unused-ignore]
    """Progress on every optimizer step (with the step time), an `eval` stage around
    evaluation and a `checkpoint` stage around saves, and a notify on a non-finite loss.

    The stages get their own hang windows (seconds; None turns hang detection off while the
    stage is open): long saves and evaluations that print nothing are not hangs."""

    def __init__(self, *, eval_window_s: float | None = None,
                 checkpoint_window_s: float | None = 1800.0) -> None:
        self.eval_window_s = eval_window_s
        self.checkpoint_window_s = checkpoint_window_s
        self._last: float | None = None
        self._stages = StageTracker()

    def _upcoming(self, state: Any, control: Any) -> None:
        # DefaultFlowCallback runs first and has set what the Trainer does right after
        # on_step_end / on_epoch_end (evaluate, then save)
        if getattr(control, "should_evaluate", False):
            self._stages.enter(EVAL, self.eval_window_s)
        elif getattr(control, "should_save", False):
            self._stages.enter(CHECKPOINT, self.checkpoint_window_s, int(state.global_step))

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        now = time.monotonic()
        dt = None if self._last is None else now - self._last
        self._last = now
        sdk.progress(int(state.global_step), step_time_s=dt)
        self._upcoming(state, control)

    def on_epoch_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self._upcoming(state, control)

    def on_evaluate(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self._stages.leave(EVAL)
        if getattr(control, "should_save", False):
            self._stages.enter(CHECKPOINT, self.checkpoint_window_s, int(state.global_step))

    def on_save(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self._stages.leave(CHECKPOINT)
        self._last = None  # the save is no step time

    def on_log(self, args: Any, state: Any, control: Any, logs: dict[str, Any] | None = None,
               **kwargs: Any) -> None:
        loss = (logs or {}).get("loss")
        if isinstance(loss, int | float) and not math.isfinite(loss):
            sdk.notify(f"loss is {loss} at step {state.global_step}", "error")

    def on_train_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self._stages.leave_all()
