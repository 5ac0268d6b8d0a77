"""The stop gate and the deadline-bound flush steps (no broker)."""

from __future__ import annotations

import asyncio

from faultwatch.streams.stopping import StopGate, run_steps


def test_gate_waits_for_running_batches_and_holds_new_ones_back() -> None:
    async def main() -> list[str]:
        gate, seen = StopGate(), []
        release = asyncio.Event()

        async def batch(name: str, wait: bool) -> None:
            async with gate.batch():
                seen.append(f"start {name}")
                if wait:
                    await release.wait()
                seen.append(f"end {name}")

        running = asyncio.create_task(batch("a", True))
        await asyncio.sleep(0)
        assert gate.busy == 1
        closing = asyncio.create_task(gate.close())
        await asyncio.sleep(0.01)
        assert not closing.done()  # batch a still runs
        late = asyncio.create_task(batch("b", False))
        release.set()
        await asyncio.wait_for(closing, 1)
        await running
        await asyncio.sleep(0.01)
        assert not late.done()  # held back, never processed
        late.cancel()
        return seen

    assert asyncio.run(main()) == ["start a", "end a"]


def test_steps_run_in_order_within_the_deadline() -> None:
    async def main() -> tuple[list[str], object]:
        order: list[str] = []

        def step(name: str) -> object:
            async def run() -> None:
                order.append(name)
            return run

        loop = asyncio.get_running_loop()
        report = await run_steps([("a", step("a")), ("b", step("b"))], loop.time() + 5,
                                 clock=loop.time)
        return order, report

    order, report = asyncio.run(main())
    assert order == ["a", "b"]
    assert report.clean and list(report.done) == ["a", "b"]  # type: ignore[attr-defined]


def test_a_stuck_step_is_given_up_at_the_deadline_and_later_steps_skipped() -> None:
    async def main() -> object:
        async def stuck() -> None:
            await asyncio.Event().wait()

        async def never() -> None:
            raise AssertionError("must be skipped")

        loop = asyncio.get_running_loop()
        t0 = loop.time()
        report = await run_steps([("deliver", stuck), ("commit", never)], t0 + 0.2,
                                 clock=loop.time)
        assert loop.time() - t0 < 1.0
        return report

    report = asyncio.run(main())
    assert report.gave_up_in == "deliver" and report.error == "deadline reached"  # type: ignore[attr-defined]
    assert report.skipped == ["commit"]  # type: ignore[attr-defined]


def test_a_failing_step_is_reported_not_raised() -> None:
    async def boom() -> None:
        raise OSError("broker gone")

    async def main() -> object:
        loop = asyncio.get_running_loop()
        return await run_steps([("commit", boom)], loop.time() + 1, clock=loop.time)

    report = asyncio.run(main())
    assert report.gave_up_in == "commit" and "broker gone" in report.error  # type: ignore[attr-defined]
