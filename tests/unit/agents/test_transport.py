"""LocalTransport: records through the in-process pipeline, decisions deduped, ticks; the
supervisor's restart not-before wait."""

from __future__ import annotations

import asyncio
import time
from types import SimpleNamespace
from typing import Any

from faultwatch.agents.supervisor import _wait_not_before
from faultwatch.agents.transport import LocalTransport
from faultwatch.core.events import Decision


def _dec(id_: str, job: str = "j", **kw: Any) -> Decision:
    return Decision(id=id_, job=job, attempt=0, action="restart", kind="error", ts=0.0, **kw)


class FakePipeline:
    """Decides d1 for every record (twice: dedupe), d2 and another job's d3 on ticks."""

    def __init__(self) -> None:
        self.records: list[tuple[bytes, bytes]] = []
        self.ticks = 0

    def submit(self, key: bytes, value: bytes, now: float) -> list[Decision]:
        self.records.append((key, value))
        return [_dec("d1"), _dec("d1")]

    def tick(self, now: float) -> list[Decision]:
        self.ticks += 1
        return [_dec("d2"), _dec("d3", job="other")]


def test_records_pass_through_and_decisions_are_published_once() -> None:
    async def main() -> tuple[list[str], list[str | None], FakePipeline]:
        published: list[str] = []
        pipe = FakePipeline()
        t = LocalTransport(pipe, "j", lambda d: published.append(d.id), time.time,
                           tick_s=0.01)
        t.start()
        t.submit(b"rec1", 0, 3, key=b"k")
        t.submit_lifecycle(b"rec2")
        got = [await t.decisions.get(2) for _ in range(2)]
        await t.finish(1)
        return published, [d.id if d else None for d in got], pipe

    published, got, pipe = asyncio.run(main())
    assert pipe.records == [(b"k", b"rec1"), (b"", b"rec2")]
    assert pipe.ticks >= 1
    assert published == ["d1", "d2"]  # once each; another job's decision is not ours
    assert got == ["d1", "d2"]


def _agent() -> Any:
    logged: list[tuple[str, dict[str, Any]]] = []
    return SimpleNamespace(stopping=asyncio.Event(),
                           log=lambda ev, **kv: logged.append((ev, kv)), logged=logged)


def test_restart_waits_until_not_before() -> None:
    async def main() -> tuple[bool, float, Any]:
        agent = _agent()
        t0 = time.time()
        ok = await _wait_not_before(agent, _dec("r", evidence={"restart_not_before": t0 + 0.5}))
        return ok, time.time() - t0, agent

    ok, took, agent = asyncio.run(main())
    assert ok and 0.45 <= took < 3
    assert agent.logged[0][0] == "restart_backoff"


def test_restart_without_not_before_or_in_the_past_is_at_once() -> None:
    async def main() -> float:
        agent = _agent()
        t0 = time.time()
        assert await _wait_not_before(agent, _dec("a"))
        assert await _wait_not_before(agent, _dec("b", evidence={"restart_not_before": 1.0}))
        assert await _wait_not_before(agent, _dec("c", evidence={"restart_not_before": "x"}))
        return time.time() - t0

    assert asyncio.run(main()) < 0.2


def test_a_signal_ends_the_backoff_wait() -> None:
    async def main() -> tuple[bool, float]:
        agent = _agent()
        asyncio.get_running_loop().call_later(0.1, agent.stopping.set)
        t0 = time.time()
        ok = await _wait_not_before(agent, _dec("r", evidence={"restart_not_before": t0 + 30}))
        return ok, time.time() - t0

    ok, took = asyncio.run(main())
    assert not ok and took < 2
