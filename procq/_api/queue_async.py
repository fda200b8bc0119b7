"""``ProcQueue``'s asyncio life: opening and closing without blocking the loop.

A mixin of ``ProcQueue``. The queue's constructor starts the supervisor's
thread and its ``close`` waits for jobs and reaps processes: both block. Here
each runs in a thread of the loop's default executor, so the loop keeps
serving its other tasks:

- ``await ProcQueue.aopen(...)`` or ``async with ProcQueue.aopen(...) as q``
  constructs the queue in a thread of its own. (``async with ProcQueue(...) as q`` works
  too; the constructor then runs on the loop, which is brief but blocking.)
- ``await q.aclose(wait=True)`` and leaving ``async with`` run ``close`` in a
  thread of the loop's default executor.

Cancellation. A task cancelled while ``aclose`` waits for the jobs turns the
close into ``close(wait=False)``, as Ctrl-C does to ``close``: waiting jobs
are cancelled, running ones killed; the task still waits (a second or so) for
the workers to be reaped, then raises ``CancelledError``, so no process
outlives a cancelled close. A task cancelled while ``aopen`` constructs the
queue raises ``CancelledError`` at once, and the queue it was opening is
closed without waiting as soon as it exists: nobody holds it.
"""

from __future__ import annotations

import functools
import threading
from collections.abc import Callable, Generator
from types import TracebackType
from typing import TYPE_CHECKING, Any, Generic, TypeVar, cast

# asyncio is imported where it is used, never at import time: procq's
# forkserver preloads procq, and every worker forked from it would carry
# asyncio and the ssl library it loads (see ``_api.config.preload_worker``).
if TYPE_CHECKING:
    import asyncio
    import concurrent.futures

    from typing_extensions import Self

    from procq._api.queue import ProcQueue

__all__ = ["AsyncFace", "Opening"]

Q = TypeVar("Q", bound="AsyncFace")


class AsyncFace:
    """``aopen``, ``aclose`` and ``async with`` of ``ProcQueue``."""

    __slots__ = ()

    @classmethod
    def aopen(cls, *args: Any, **kwargs: Any) -> Opening[Self]:
        """Open a queue without blocking the event loop: ``q = await
        ProcQueue.aopen(lanes=4)``, or ``async with ProcQueue.aopen(lanes=4)
        as q`` (closed as ``async with`` closes). Takes ``ProcQueue``'s
        arguments; the constructor runs in a thread of its own."""
        return Opening(functools.partial(cls, *args, **kwargs))

    async def aclose(self, wait: bool = True) -> None:
        """The asyncio form of :meth:`close`: the close runs in a thread, and
        the loop carries on meanwhile. A task cancelled while it waits makes
        it a ``close(wait=False)`` and still waits for the workers to be
        reaped before ``CancelledError`` goes on (see ``_api.queue_async``)."""
        q = cast("ProcQueue", self)
        if type(wait) is not bool:
            raise TypeError(f"aclose(): wait must be True or False, got {type(wait).__name__}: {wait!r}")
        q._here()
        import asyncio

        closing = asyncio.get_running_loop().run_in_executor(None, q.close, wait)
        try:
            await asyncio.shield(closing)
        except asyncio.CancelledError:
            # close(wait=False) ends the jobs at once, even while close(wait=True)
            # holds the close lock on the executor's thread; both then return.
            q._core.start_closing()
            q._supervisor.cancel_all()
            await _uncancellable(closing)
            raise

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        q = cast("ProcQueue", self)
        if q._life.value == "foreign":  # a forked child's copy: the parent's to close (as __exit__)
            return
        await self.aclose(wait=not (exc_type is not None and issubclass(exc_type, KeyboardInterrupt)))


async def _uncancellable(future: asyncio.Future[Any]) -> None:
    """Await ``future`` to its end, whatever cancellations come meanwhile
    (the caller raises its ``CancelledError`` after)."""
    import asyncio

    while not future.done():
        try:
            await asyncio.shield(future)
        except asyncio.CancelledError:
            continue
    if not future.cancelled():
        future.result()


class Opening(Generic[Q]):
    """What ``ProcQueue.aopen`` returns: awaitable (the open queue) and an
    async context manager (the queue, closed at the block's end). The
    constructor runs in a thread of its own; the awaiting task waits for it
    without blocking the loop."""

    __slots__ = ("_make", "_queue")

    def __init__(self, make: Callable[[], Q]) -> None:
        self._make = make
        self._queue: Q | None = None

    def __await__(self) -> Generator[Any, None, Q]:
        return self._open().__await__()

    async def _open(self) -> Q:
        import asyncio
        import concurrent.futures

        made: concurrent.futures.Future[Q] = concurrent.futures.Future()
        make = self._make

        def build() -> None:
            try:
                queue = make()
            except BaseException as error:
                made.set_exception(error)
            else:
                made.set_result(queue)

        threading.Thread(target=build, name="procq-aopen", daemon=True).start()
        try:
            # (Shielded: asyncio.wrap_future would cancel ``made``, which the
            # thread then could not set.)
            return await asyncio.shield(asyncio.wrap_future(made))
        except asyncio.CancelledError:
            made.add_done_callback(_close_unwanted)
            raise

    async def __aenter__(self) -> Q:
        self._queue = await self._open()
        return self._queue

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        if self._queue is not None:
            await self._queue.__aexit__(exc_type, exc, tb)


def _close_unwanted(made: concurrent.futures.Future[Any]) -> None:
    """A queue whose opener was cancelled: close it without waiting, on a
    thread of its own (this may run on the loop, which must not block)."""
    if made.exception() is None:
        threading.Thread(target=made.result().close, kwargs={"wait": False}, name="procq-aopen-close").start()
