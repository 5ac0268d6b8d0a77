"""A Lightning `Callback` reporting steps, validation and checkpoint saves to faultwatch."""

from __future__ import annotations

import time
from typing import Any

try:
    from lightning.pytorch import Callback  # type: ignore[import-not-found,unused-ignore]
except ImportError:  # the standalone pytorch_lightning package
    from pytorch_lightning import Callback  # type: ignore[import-not-found,no-redef,unused-ignore]

from faultwatch import sdk
from faultwatch.integrations.stages import StageTracker

EVAL, CHECKPOINT = "eval", "checkpoint"


class FaultwatchCallback(Callback):  # type: ignore[misc,unused-ignore]
    """Progress after every training batch (global step, step time and the loss: a NaN/inf
    loss is a divergence), an `eval` stage around validation, a `checkpoint` stage from a
    save until training continues. Windows in seconds; None: no hang detection in the
    stage."""

    def __init__(self, *, eval_window_s: float | None = None,
                 checkpoint_window_s: float | None = 1800.0) -> None:
        self.eval_window_s = eval_window_s
        self.checkpoint_window_s = checkpoint_window_s
        self._last: float | None = None
        self._stages = StageTracker()

    def on_train_batch_start(self, trainer: Any, pl_module: Any, batch: Any,
                             batch_idx: int) -> None:
        self._stages.leave(CHECKPOINT)  # Lightning has no "saved" hook: training went on

    def on_train_batch_end(self, trainer: Any, pl_module: Any, outputs: Any, batch: Any,
                           batch_idx: int) -> None:
        now = time.monotonic()
        dt = None if self._last is None else now - self._last
        self._last = now
        # the loss rides on the progress note: a NaN/inf one is a divergence (a notice by
        # default, or the `divergence_action`), a finite one feeds the spike detector.
        # Lightning's default bar (rich) prints nothing off a terminal, so this is the only
        # way the loss reaches faultwatch there.
        metrics: dict[str, float] = {}
        loss: Any = outputs.get("loss") if isinstance(outputs, dict) else outputs
        try:
            metrics["loss"] = float(loss.item() if hasattr(loss, "item") else loss)
        except (TypeError, ValueError):
            pass
        sdk.progress(int(trainer.global_step), step_time_s=dt, **metrics)

    def on_validation_start(self, trainer: Any, pl_module: Any) -> None:
        self._stages.leave(CHECKPOINT)
        self._stages.enter(EVAL, self.eval_window_s)

    def on_validation_end(self, trainer: Any, pl_module: Any) -> None:
        self._stages.leave(EVAL)
        self._last = None

    def on_save_checkpoint(self, trainer: Any, pl_module: Any, checkpoint: Any) -> None:
        self._stages.enter(CHECKPOINT, self.checkpoint_window_s, int(trainer.global_step))
        self._last = None

    def on_train_epoch_start(self, trainer: Any, pl_module: Any) -> None:
        self._stages.leave(CHECKPOINT)

    def on_train_end(self, trainer: Any, pl_module: Any) -> None:
        self._stages.leave_all()
