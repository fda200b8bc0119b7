"""What mypy infers from procq's public types: checked by mypy (``.ci/run``
and ``tests/test_typing.py``), never run. Each ``assert_type`` pins an
inferred type; each ``# type: ignore[code]`` pins an error mypy must report
(``warn_unused_ignores`` fails the check if it does not)."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator

from typing_extensions import assert_type

from procq import Cached, FailureKind, InFlight, Job, JobFailed, JobHandle, ProcQueue, Queued


def resize(image_id: int, width: int = 640, *, lane: str = "x") -> bytes:
    return b""


def outcomes(q: ProcQueue) -> None:
    job = Job.of("resize:1", resize, lane="cpu")(1, width=320)
    assert_type(job, Job[bytes])
    match q.push(job):
        case Queued(handle) | InFlight(handle):
            assert_type(handle, JobHandle[bytes])
            assert_type(handle.result(), bytes)
        case Cached(output):
            assert_type(output, bytes)
    assert_type(q.push_and_wait(job), bytes)
    assert_type(q.map(len, ["a"]), Iterator[int])
    assert_type(q.map(len, ["a"], return_failures=True), Iterator[int | JobFailed])
    assert_type(q.amap(len, ["a"]), AsyncIterator[int])
    Job.of("resize:2", resize)(1, lane="cpu")  # fn's own keyword, checked against fn
    Job.of("resize:3", resize)("1")  # type: ignore[arg-type]
    Job.of("resize:4", resize)(1, height=2)  # type: ignore[call-arg]
    Job.of("resize:5", resize, lane=3)  # type: ignore[arg-type]


async def asynchronous() -> None:
    async with ProcQueue.aopen(lanes=2) as q:
        assert_type(q, ProcQueue)
        assert_type(await q.apush_and_wait(Job.of("k", resize)(2)), bytes)
        async for out in q.amap(resize, [1, 2]):
            assert_type(out, bytes)
    opened = await ProcQueue.aopen(2)
    assert_type(opened, ProcQueue)
    await opened.aclose(wait=False)


def kinds() -> list[FailureKind]:
    return ["crashed", "exploded"]  # type: ignore[list-item]
