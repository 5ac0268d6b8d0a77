"""Supervised processor tasks (streams/tasks.py): an error, a stray CancelledError and an
unexpected return are each logged as processor_task_ended and end the task as before; the
task's own cancellation (the app stopping) and an expected return are not logged."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from faultwatch.eventlog import ERROR, LEVELS
from faultwatch.streams import tasks


@pytest.fixture
def logged(monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, dict[str, Any]]]:
    out: list[tuple[str, dict[str, Any]]] = []
    monkeypatch.setattr(tasks, "log_event", lambda e, **kw: out.append((e, kw)))
    return out


async def _boom() -> None:
    raise ValueError("bad record")


async def _stray_cancel() -> None:
    raise asyncio.CancelledError  # as aiokafka's consumer.stop() raised it


async def _done() -> None:
    return None


def test_an_error_is_logged_and_raised(logged: list[Any]) -> None:
    with pytest.raises(ValueError):
        asyncio.run(tasks.supervised("lemon_follower", _boom)())
    assert logged == [("processor_task_ended",
                       {"task": "lemon_follower", "error": "ValueError: bad record"})]
    assert LEVELS["processor_task_ended"] == ERROR


def test_a_stray_cancellation_is_logged_and_raised(logged: list[Any]) -> None:
    async def main() -> None:
        await tasks.supervised("lemon_follower", _stray_cancel)()

    with pytest.raises(asyncio.CancelledError):
        asyncio.run(main())
    assert logged == [("processor_task_ended",
                       {"task": "lemon_follower", "error": "CancelledError"})]


def test_its_own_cancellation_is_not_logged(logged: list[Any]) -> None:
    async def main() -> bool:
        started = asyncio.Event()

        async def forever() -> None:
            started.set()
            await asyncio.Event().wait()

        t = asyncio.create_task(tasks.supervised("holds_follower", forever)())
        await started.wait()
        t.cancel()
        await asyncio.gather(t, return_exceptions=True)
        return t.cancelled()

    assert asyncio.run(main())
    assert logged == []


def test_a_return_is_logged_only_for_a_task_meant_to_run_forever(logged: list[Any]) -> None:
    asyncio.run(tasks.supervised("announce_at_start", _done, forever=False)())
    assert logged == []
    task = tasks.supervised("registry_follower", _done)
    assert task.__name__ == "registry_follower"
    asyncio.run(task())
    assert logged == [("processor_task_ended",
                       {"task": "registry_follower", "error": "returned"})]
