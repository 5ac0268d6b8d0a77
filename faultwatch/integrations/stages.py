"""The SDK stages a framework callback has open: each opened at most once, closed by name."""

from __future__ import annotations

from faultwatch import sdk


class StageTracker:
    """Opens and closes named `sdk.stage`s for callbacks that see a stage's start and end in
    different hooks."""

    def __init__(self) -> None:
        self._open: dict[str, sdk.stage] = {}

    def enter(self, name: str, window_s: float | None, step: int | None = None) -> None:
        """Open `name` (once); `step`: the training step it is about (a checkpoint's)."""
        if name not in self._open:
            st = sdk.stage(name, hang_window_s=window_s, step=step)
            st.__enter__()
            self._open[name] = st

    def leave(self, name: str) -> None:
        st = self._open.pop(name, None)
        if st is not None:
            st.__exit__(None, None, None)

    def leave_all(self) -> None:
        for name in list(self._open):
            self.leave(name)
