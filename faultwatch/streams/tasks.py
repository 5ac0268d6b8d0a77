"""The processor's background tasks, supervised: one that ends unexpectedly says so."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

from faultwatch.eventlog import log_event


def supervised(name: str, run: Callable[[], Awaitable[object]], forever: bool = True
               ) -> Callable[[], Awaitable[None]]:
    """`run` as a task for `app.task`: an error, a cancellation that is not the task's own
    (a library's stray CancelledError) or, when it should run `forever`, a return is
    logged as `processor_task_ended` (task, error) before it ends the task as before (an
    error crashes the worker; the app's own cancellation at stop is not logged)."""

    async def task() -> None:
        try:
            await run()
        except asyncio.CancelledError as e:
            me = asyncio.current_task()
            if me is None or not me.cancelling():
                log_event("processor_task_ended", task=name,
                          error=f"CancelledError: {e}" if str(e) else "CancelledError")
            raise
        except Exception as e:
            log_event("processor_task_ended", task=name, error=f"{type(e).__name__}: {e}")
            raise
        if forever:
            log_event("processor_task_ended", task=name, error="returned")

    task.__name__ = task.__qualname__ = name  # faust labels the task with it
    return task
