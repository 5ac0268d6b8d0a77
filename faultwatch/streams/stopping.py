"""A worker's bounded stop: a gate that holds new batches back, then named flush steps run
against one deadline, reporting what was done and what had to be given up."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass, field

StepFn = Callable[[], Awaitable[object]]


class StopGate:
    """Counts the batches being processed; once closed, a new batch never starts: it waits
    until the process exits, unprocessed and never acknowledged, so its source offsets are
    not committed and the partition's next owner reads it again."""

    def __init__(self) -> None:
        self.stopping = False
        self._busy = 0
        self._idle = asyncio.Event()
        self._idle.set()

    @property
    def busy(self) -> int:
        """Batches in progress now."""
        return self._busy

    @asynccontextmanager
    async def batch(self) -> AsyncIterator[None]:
        """Wrap the processing of one batch (both stages share one gate)."""
        if self.stopping:
            await asyncio.get_running_loop().create_future()  # never resolves: held back
        self._busy += 1
        self._idle.clear()
        try:
            yield
        finally:
            self._busy -= 1
            if self._busy == 0:
                self._idle.set()

    async def close(self) -> None:
        """Let no new batch start and wait for the ones in progress to finish."""
        self.stopping = True
        await self._idle.wait()


@dataclass
class StopReport:
    """What a stop did (step -> seconds) and, when the deadline or an error cut it short,
    the step it gave up in and why."""

    done: dict[str, float] = field(default_factory=dict)
    gave_up_in: str | None = None
    error: str | None = None
    skipped: list[str] = field(default_factory=list)

    @property
    def clean(self) -> bool:
        return self.gave_up_in is None


async def run_steps(steps: Sequence[tuple[str, StepFn]], deadline: float,
                    clock: Callable[[], float] = time.monotonic) -> StopReport:
    """Run the steps in order, each within what is left before `deadline` (a `clock` time).
    The first step that times out or raises ends the run; later steps are skipped."""
    report = StopReport()
    for i, (name, fn) in enumerate(steps):
        left = deadline - clock()
        t0 = clock()
        try:
            if left <= 0:
                raise TimeoutError
            await asyncio.wait_for(fn(), left)
        except TimeoutError:
            report.gave_up_in, report.error = name, "deadline reached"
        except Exception as e:  # noqa: BLE001 - a stop reports, it never raises
            report.gave_up_in, report.error = name, f"{type(e).__name__}: {e}"
        if report.gave_up_in is not None:
            report.skipped = [n for n, _ in steps[i + 1:]]
            return report
        report.done[name] = round(clock() - t0, 3)
    return report
