"""The asyncio faces: opening and closing without blocking the loop
(``ProcQueue.aopen``, ``aclose``, ``async with``), ``amap``, and what
cancelling each of them does. (A cancelled ``apush`` that waits for room
releases its claim: ``test_lanes``.)"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from typing import Any

import jobs
import pytest
from core_support import awaited, within

from procq import Completed, Failed, JobFailed, ProcQueue, Queued
from procq import Job as PJob


class _Ticker:
    """Counts how often the loop ran it while a blocking-looking call awaited."""

    def __init__(self) -> None:
        self.ticks = 0

    async def run(self) -> None:
        while True:
            self.ticks += 1
            await asyncio.sleep(0.005)


def _nothing_left(q: ProcQueue) -> None:
    stats = q.stats()
    assert stats.pending == 0 and stats.processing == 0, stats


def test_aopen_constructs_off_the_loop_and_async_with_closes() -> None:
    built_on: list[int] = []

    class Recorded(ProcQueue):
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            built_on.append(threading.get_ident())
            super().__init__(*args, **kwargs)

    async def main() -> ProcQueue:
        async with Recorded.aopen(lanes=1) as q:
            assert isinstance(q, Recorded)
            assert await q.apush_and_wait(PJob("sq", jobs.square, (7,))) == 49
        assert built_on and built_on[0] != threading.get_ident()
        return q

    q = asyncio.run(main())
    assert q.closed and q._worker_pids() == []


def test_await_aopen_then_aclose_and_plain_async_with() -> None:
    async def main() -> None:
        q = await ProcQueue.aopen(1)
        assert await q.apush_and_wait(PJob("a", jobs.square, (3,))) == 9
        await q.aclose()
        assert q.closed
        await q.aclose()  # again: nothing
        async with ProcQueue(1) as q2:
            assert await q2.apush_and_wait(PJob("b", jobs.square, (4,))) == 16
        assert q2.closed

    asyncio.run(main())


def test_aclose_waits_for_jobs_without_blocking_the_loop() -> None:
    async def main() -> None:
        q = await ProcQueue.aopen(1)
        outcome = await q.apush(PJob("slow", jobs.sleep, (0.5,)))
        assert isinstance(outcome, Queued)
        ticker = _Ticker()
        ticking = asyncio.create_task(ticker.run())
        await within(q.aclose())
        ticking.cancel()
        assert ticker.ticks > 10  # the loop ran on while close waited for the job
        assert outcome.handle.result(timeout=0) == 0.5

    asyncio.run(main())


def test_aclose_cancelled_midway_closes_without_waiting_then_raises() -> None:
    async def main() -> None:
        q = await ProcQueue.aopen(1)
        outcome = await q.apush(PJob("forever", jobs.block_forever))
        closing = asyncio.create_task(q.aclose())
        while not q.closed:  # the close began (no more pushes)
            await asyncio.sleep(0.01)
        closing.cancel()
        with pytest.raises(asyncio.CancelledError):
            await within(closing)
        assert q._life.value == "closed" and q._worker_pids() == []
        state = outcome.handle.state
        assert isinstance(state, Failed) and state.failure.kind == "cancelled"

    asyncio.run(main())


def test_aclose_checks_wait() -> None:
    async def main() -> None:
        async with ProcQueue.aopen(1) as q:
            with pytest.raises(TypeError, match="wait must be True or False"):
                await q.aclose(wait="no")  # type: ignore[arg-type]

    asyncio.run(main())


def test_cancelling_a_task_awaiting_a_handle_leaves_the_job_running() -> None:
    async def main() -> None:
        async with ProcQueue.aopen(1) as q:
            outcome = await q.apush(PJob("shared", jobs.sleep, (0.3,)))
            assert isinstance(outcome, Queued)
            waiter = asyncio.create_task(awaited(outcome.handle))
            await asyncio.sleep(0.05)
            waiter.cancel()
            with pytest.raises(asyncio.CancelledError):
                await waiter
            assert await within(awaited(outcome.handle)) == 0.3  # the job ran on
            assert q.state("shared") == Completed(0.3)

    asyncio.run(main())


@pytest.mark.parametrize("ordered", [True, False])
def test_amap_yields_what_map_yields(ordered: bool) -> None:
    async def main() -> None:
        async with ProcQueue.aopen(2) as q:
            outs = [out async for out in q.amap(jobs.square, range(20), ordered=ordered, chunksize=3)]
            expected = list(q.map(jobs.square, range(20)))
            assert (outs if ordered else sorted(outs)) == expected
            _nothing_left(q)
            assert q.keys() == []  # claimed keys forgotten once handed out, as map does

    asyncio.run(main())


def test_amap_failures_and_timeout() -> None:
    async def main() -> None:
        async with ProcQueue.aopen(2) as q:
            outs = [out async for out in q.amap(jobs.boom, ["a"], return_failures=True)]
            assert len(outs) == 1 and isinstance(outs[0], JobFailed)
            with pytest.raises(JobFailed, match="item 0"):
                async for _ in q.amap(jobs.boom, ["b"]):
                    pass
            with pytest.raises(TimeoutError, match=r"timeout of 0\.2s"):
                async for _ in q.amap(jobs.sleep, [5.0], timeout=0.2):
                    pass
            _nothing_left(q)

    asyncio.run(main())


def _item_key(item: float) -> str:
    return f"item:{item}"


@pytest.mark.parametrize("ordered", [True, False])
@pytest.mark.parametrize("stop", ["break", "cancel"])
def test_amap_left_early_cancels_its_jobs(ordered: bool, stop: str) -> None:
    items = [0.0, 30.0, 30.0, 30.0, 30.0]

    async def consume(q: ProcQueue, first: asyncio.Event) -> None:
        async with contextlib.aclosing(q.amap(jobs.sleep, items, key=_item_key, ordered=ordered)) as outs:
            async for out in outs:
                assert out == 0.0
                first.set()
                if stop == "break":
                    break
                await asyncio.sleep(60)  # cancelled here

    async def main() -> None:
        async with ProcQueue.aopen(2) as q:
            first = asyncio.Event()
            task = asyncio.create_task(consume(q, first))
            await within(first.wait())
            if stop == "cancel":
                task.cancel()
                with pytest.raises(asyncio.CancelledError):
                    await within(task)
            else:
                await within(task)
            _nothing_left(q)
            for item in items[1:]:
                state = q.state(_item_key(item))
                assert state is None or (isinstance(state, Failed) and state.failure.kind == "cancelled")

    asyncio.run(within(main(), 30))


def test_amap_checks_its_arguments_at_once() -> None:
    async def main() -> None:
        async with ProcQueue.aopen(1) as q:
            with pytest.raises(ValueError, match="chunksize"):
                q.amap(jobs.square, [1], chunksize=0)

    asyncio.run(main())
