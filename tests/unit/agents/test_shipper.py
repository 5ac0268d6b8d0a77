"""Shipper without a broker: the delivery thread, the memory queue and the spool cap."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

from faultwatch.agents.shipper import Shipper
from faultwatch.agents.spool import KEEP, Spool


class FakeProducer:
    """Acks everything when `up`, else fails to start (a broker that is down)."""

    up = False
    sent: list[bytes] = []

    def __init__(self, **kw: Any):
        pass

    async def start(self) -> None:
        if not FakeProducer.up:
            raise ConnectionError("broker down")

    async def stop(self) -> None:
        pass

    async def send(self, topic: str, value: bytes, key: bytes) -> asyncio.Future[Any]:
        FakeProducer.sent.append(value)
        f: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        f.set_result(None)
        return f


def test_cap_is_enforced_off_the_submitting_thread_and_replay_delivers(tmp_path: Path) -> None:
    FakeProducer.up, FakeProducer.sent = False, []
    gaps: list[tuple[int, int, int]] = []

    async def main() -> tuple[Shipper, float]:
        sp = Spool(tmp_path, cap_bytes=256 * 1024)
        sh = Shipper("x:1", "t", b"k", sp, lambda *a, **k: None, producer_factory=FakeProducer)
        sh.on_gap(lambda *d: gaps.append(d))
        sh.start()
        worst = 0.0
        for i in range(3000):
            t0 = time.perf_counter()
            sh.submit(b"%06d" % i + b"x" * 1000, KEEP if i % 100 == 0 else 0, 10)
            worst = max(worst, time.perf_counter() - t0)
            if i % 100 == 0:
                await asyncio.sleep(0.005)
        await asyncio.sleep(1.5)  # compaction and the (rate-limited) gap report
        assert sh.spool_bytes() <= 256 * 1024 * 1.2
        FakeProducer.up = True  # the broker comes back: everything left is delivered
        assert await sh.drain(10)
        await sh.close()
        return sh, worst

    sh, worst = asyncio.run(main())
    assert gaps and sum(g[1] for g in gaps) == sh.stats.drops > 0
    kept = [v for v in FakeProducer.sent]
    assert len(kept) == 3000 - sum(g[0] for g in gaps)
    assert all(b"%06d" % i in b"".join(kept) for i in range(0, 3000, 100))  # KEEP survived
    ids = [int(v[:6]) for v in kept]
    assert ids == sorted(ids)  # in order, no duplicates
    assert worst < 0.05, worst
