"""The one way tests wait: poll for the event they need, with a generous deadline.

Tests never sleep a guess. `wait_until` polls a probe until its value satisfies a predicate
and fails with what was awaited and the last value seen; `raise_on_timeout=False` returns
that last value instead, for waits whose caller asserts on it (or expects nothing to come).
`wait_until_async` is the same wait inside a running event loop (e.g. reading a topic
batch by batch until what the test needs has arrived).
"""

from __future__ import annotations

import asyncio
import inspect
import time
from collections.abc import Callable
from typing import Any, TypeVar

T = TypeVar("T")

_SHOWN = 1500  # characters of the last value a timeout message shows


def _timeout_message(timeout_s: float, what: str, probe: object, last: object,
                     detail: Callable[[], str] | None) -> str:
    name = what or getattr(probe, "__name__", "a condition")
    if isinstance(last, str) and len(last) > _SHOWN:  # a log: its end says most
        shown = f"...{last[-_SHOWN:]!r} ({len(last)} chars)"
    else:
        shown = repr(last)
        if len(shown) > _SHOWN:
            shown = shown[:_SHOWN] + f"... ({len(shown)} chars)"
    msg = f"timed out after {timeout_s:g} s waiting for {name}; last value seen: {shown}"
    if detail is not None:
        msg += "\n" + detail()
    return msg


def wait_until(probe: Callable[[], T | None], timeout_s: float, what: str = "",
               interval_s: float = 0.1, *, until: Callable[[Any], object] = bool,
               raise_on_timeout: bool = True,
               detail: Callable[[], str] | None = None) -> T:
    """Call `probe` every `interval_s` until `until(value)` holds, then return that value.

    After `timeout_s` raise AssertionError naming `what` and the last value seen (plus
    `detail()`, e.g. a log's tail), or return the last value when `raise_on_timeout` is
    false. The probe may itself raise (e.g. "the process died") to fail at once.
    """
    deadline = time.monotonic() + timeout_s
    while True:
        got: Any = probe()
        if until(got):
            return got
        if time.monotonic() > deadline:
            if not raise_on_timeout:
                return got
            raise AssertionError(_timeout_message(timeout_s, what, probe, got, detail))
        time.sleep(interval_s)


async def wait_until_async(probe: Callable[[], Any], timeout_s: float,
                           what: str = "", interval_s: float = 0.05, *,
                           until: Callable[[Any], object] = bool, raise_on_timeout: bool = True,
                           detail: Callable[[], str] | None = None) -> Any:
    """`wait_until` inside a running event loop: the probe may be a coroutine function (e.g.
    one that reads a batch from a consumer), and the pause is `asyncio.sleep`."""
    deadline = time.monotonic() + timeout_s
    while True:
        got = probe()
        if inspect.isawaitable(got):
            got = await got
        if until(got):
            return got
        if time.monotonic() > deadline:
            if not raise_on_timeout:
                return got
            raise AssertionError(_timeout_message(timeout_s, what, probe, got, detail))
        if interval_s > 0:
            await asyncio.sleep(interval_s)
