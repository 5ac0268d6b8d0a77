"""The shell's delivery of a batch's outputs: a failed send is retried, in order, and the
batch does not end (so its source events are not acknowledged) until all are delivered."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from faultwatch.streams import faust_app


def test_failed_sends_are_retried_from_the_first_failure_in_order(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(faust_app, "RETRY_FIRST_S", 0.01)
    sent: list[str] = []
    failures = {"b": 2}  # b's delivery fails twice (e.g. the broker is away)

    def sender(name: str) -> Any:
        async def send() -> Any:
            sent.append(name)
            fut: asyncio.Future[str] = asyncio.get_running_loop().create_future()
            if failures.get(name, 0) > 0:
                failures[name] -= 1
                fut.set_exception(OSError(f"{name} not delivered"))
            else:
                fut.set_result(name)
            return fut
        return send

    async def main() -> None:
        await faust_app.deliver([sender(x) for x in "abc"], "test")

    asyncio.run(main())
    assert sent == ["a", "b", "c", "b", "c", "b", "c"]


def test_a_send_that_raises_at_once_holds_back_the_later_ones(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(faust_app, "RETRY_FIRST_S", 0.01)
    sent: list[str] = []
    raised = [False]

    def sender(name: str) -> Any:
        async def send() -> Any:
            if name == "a" and not raised[0]:
                raised[0] = True
                raise ValueError("MessageSizeTooLargeError")
            sent.append(name)
            fut: asyncio.Future[str] = asyncio.get_running_loop().create_future()
            fut.set_result(name)
            return fut
        return send

    asyncio.run(faust_app.deliver([sender(x) for x in "ab"], "test"))
    assert sent == ["a", "b"]  # b never overtook a
