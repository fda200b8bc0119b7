"""procq jobs as ``concurrent.futures`` futures, and ``as_completed`` over handles.

``JobFuture`` is a real ``concurrent.futures.Future`` that mirrors one
``JobHandle``: ``handle.future()`` makes one, and ``procq.Executor.submit``
returns one. It is resolved by the handle's done callback (through the
core's completion callbacks, so a queue on a store gives it an outcome only
once that outcome is durable); no thread waits per future.

Its life, against the stdlib's. A future of ``handle.future()`` stays PENDING
while its job waits and runs (procq tells no one when a job starts), and goes
to FINISHED or CANCELLED when the job ends; its ``cancel()`` asks procq
instead of its own state: it cancels the job only while procq still has it
waiting (``Pending``), and returns False once it has started, as the stdlib
does for a running future. An executor's future is PENDING while it waits in
the executor, and RUNNING from the moment the executor hands its job to the
queue (``handed_over``), as ``ProcessPoolExecutor``'s are once in its call
queue: ``cancel()`` then returns False. A job cancelled by any route
(``cancel()``, ``q.cancel(key)``, a close without waiting) ends its future
cancelled, unless the future is RUNNING (handed over): that one fails with
the ``JobFailed`` (kind ``"cancelled"``), a running future being past
cancelling. A future that only joined another push's job (``InFlight``) never
cancels that job: cancelling it detaches the future alone.

The stdlib's waiters (``wait``, ``as_completed``) learn of a cancellation
only from ``set_running_or_notify_cancel()``, which may be called once per
future; ``_notified`` (under ``_settle_lock``) makes sure exactly one path
calls it: the hand-over, the job's end, or ``cancel()``, whichever comes first.

What an executor's future raises (``unwrap``), as ``ProcessPoolExecutor``'s
would: the job's own exception, any ``BaseException`` (``SystemExit``
included), and what pickling its result raised; ``BrokenJob`` (a
``JobFailed`` and a ``BrokenProcessPool``) where the worker died or broke the
protocol, or nothing of the job's exception came back; ``JobFailed`` for
procq's own limits (``"timeout"``, ``"memory"``).
"""

from __future__ import annotations

import contextlib
import logging
import queue
import threading
import time
from collections.abc import Iterable, Iterator
from concurrent.futures import Future
from concurrent.futures._base import CANCELLED, CANCELLED_AND_NOTIFIED, FINISHED
from concurrent.futures.process import BrokenProcessPool
from typing import TYPE_CHECKING, Any, Generic, TypeVar

from procq._model.errors import JobFailed
from procq._model.job import check_wait
from procq._model.values import Pending

if TYPE_CHECKING:
    from procq._api.handle import JobHandle

__all__ = ["BrokenJob", "JobFuture", "as_completed", "run_callback"]

T = TypeVar("T")
W = TypeVar("W")

LOGGER = logging.getLogger("procq")


class BrokenJob(JobFailed, BrokenProcessPool):
    """A ``JobFailed`` that is also a ``concurrent.futures.process.BrokenProcessPool``.

    ``procq.Executor``'s futures raise it where ``ProcessPoolExecutor``'s would
    raise ``BrokenProcessPool``: the job's worker died (``failure.kind ==
    "crashed"``, with its signal or exit code) or broke procq's protocol, or the
    job's arguments or outcome could not cross between the processes. Unlike
    ``ProcessPoolExecutor``'s, it fails this one job: the executor is not
    broken, its other jobs carry on and the next ``submit`` works.
    """


def run_callback(fn: Any, arg: Any) -> None:
    """Call a user's done callback; log what it raises, as the stdlib does.
    It runs in whichever thread ended the job (procq's I/O thread, or a
    waiter's reading the answer): what it raises belongs to none of them,
    ``SystemExit`` included. Only ``KeyboardInterrupt`` goes on up."""
    try:
        fn(arg)
    except KeyboardInterrupt:
        raise
    except BaseException:
        LOGGER.exception("exception calling callback for %r", arg)


class JobFuture(Future[T]):
    """A ``concurrent.futures.Future`` resolved by a procq job (see the module docstring).

    With ``unwrap`` (the executor's futures) a failure sets what
    ``ProcessPoolExecutor`` would (see the module docstring). Without it
    (``handle.future()``) every failure is ``JobFailed``, as the handle raises.
    """

    def __init__(self, handle: JobHandle[T] | None, *, owned: bool, unwrap: bool) -> None:
        super().__init__()
        self._handle = handle
        self._owned = owned  # its job is this future's own claim, to cancel
        self._unwrap = unwrap
        self._settle_lock = threading.Lock()
        self._notified = False  # set_running_or_notify_cancel() was called (at most once)
        if handle is not None:
            handle.add_done_callback(self._settle)

    @property
    def key(self) -> str | None:
        """The key of the job behind the future (None for one made from a cached output)."""
        return None if self._handle is None else self._handle.key

    def add_done_callback(self, fn: Any) -> None:
        """As the stdlib's, but what ``fn`` raises is logged whatever it is
        (``run_callback``): never raised in the thread that ended the job."""
        with self._condition:
            if self._state not in (CANCELLED, CANCELLED_AND_NOTIFIED, FINISHED):
                self._done_callbacks.append(fn)  # type: ignore[attr-defined]  # (the stdlib's list)
                return
        run_callback(fn, self)

    def _invoke_callbacks(self) -> None:
        for callback in self._done_callbacks:  # type: ignore[attr-defined]
            run_callback(callback, self)

    def handed_over(self) -> bool:
        """The executor hands the job to its queue: the future is RUNNING from
        now on (True), or was cancelled while it waited (False: skip it)."""
        return self._notify()

    def cancel(self) -> bool:
        """Cancel the job if procq has not started it (see the module docstring)."""
        if self.done():
            return self.cancelled()
        if self.running():
            return False  # handed over by its executor, as in ProcessPoolExecutor's call queue
        handle = self._handle
        if self._owned and handle is not None and (not isinstance(handle.state, Pending) or not handle.cancel()):
            return self.cancelled()  # it started, or ended, meanwhile
        # (A job cancelled here reaches _settle too, in this thread or another.)
        if not Future.cancel(self):
            return False
        self._notify()
        return True

    def result(self, timeout: float | None = None) -> T:
        return super().result(self._wait_job(timeout))

    def exception(self, timeout: float | None = None) -> BaseException | None:
        return super().exception(self._wait_job(timeout))

    def _wait_job(self, timeout: float | None) -> float | None:
        """Wait for the job on this thread first, as its handle's ``result``
        does (reading its answer here where it can), if it is this future's
        own: a future that only joined another push's job may be cancelled
        (detached) while the job runs on, and must stop waiting then. The
        time left of ``timeout``, for the future's own wait (its callback may
        still be on its way: with a store, after the commit)."""
        handle = self._handle
        if handle is None or not self._owned or self.done():
            return timeout
        number = isinstance(timeout, (int, float)) and not isinstance(timeout, bool)
        if timeout is not None and not (number and timeout > 0):
            return timeout  # (the stdlib's own wait says what it makes of it)
        deadline = None if timeout is None else time.monotonic() + timeout
        handle._wait(timeout)
        return None if deadline is None else max(0.0, deadline - time.monotonic())

    def _notify(self) -> bool:
        """Call ``set_running_or_notify_cancel()`` unless called before: True if
        the future is now running (to be resolved by the caller), False if not."""
        with self._settle_lock:
            if self._notified:
                return False
            self._notified = True
            return self.set_running_or_notify_cancel()

    def _settle(self, handle: JobHandle[T]) -> None:
        """The job ended: resolve the future (in whichever thread ended it)."""
        try:
            value = handle.result()
        except JobFailed as failed:
            if failed.failure.kind == "cancelled":
                if Future.cancel(self):
                    self._notify()
                elif self.running():  # handed over, then cancelled through the queue (q.cancel(key))
                    self.set_exception(failed)
                return
            if self._resolvable():
                self.set_exception(self._unwrapped(failed) if self._unwrap else failed)
            return
        if self._resolvable():
            self.set_result(value)

    def _resolvable(self) -> bool:
        """True if the ending job's outcome is this future's to set: it was
        handed over (RUNNING), or is notified now; False once cancelled."""
        return self._notify() or self.running()

    @staticmethod
    def _unwrapped(failed: JobFailed) -> BaseException:
        """What ``ProcessPoolExecutor`` would raise for this failure (see the module docstring)."""
        failure = failed.failure
        cause = failed.__cause__  # the job's exception, or the remote traceback's text (``_RemoteTraceback``)
        if failure.kind == "error" and failure.exception is not None:
            return failure.exception
        if failure.kind in ("crashed", "protocol", "error"):
            broken = BrokenJob(failed.key, failure, failed.item)
            broken.__cause__ = cause
            return broken
        return failed


def as_completed(items: Iterable[W], timeout: float | None = None) -> Iterator[W]:
    """Yield each handle (or future) of ``items`` as it ends, the already ended first.

    ``items`` may mix ``JobHandle`` and ``concurrent.futures.Future`` objects
    (anything with ``add_done_callback``); duplicates are yielded once. Past
    ``timeout`` seconds from the call, raises ``TimeoutError`` naming how many
    had not ended (those keep running). It sleeps on a queue its callbacks feed,
    never polling.
    """
    timeout = check_wait(timeout)
    deadline = None if timeout is None else time.monotonic() + timeout
    unique = list(dict.fromkeys(items))
    total = len(unique)
    ended = _Ended[W]()
    for item in unique:
        item.add_done_callback(ended.put)  # type: ignore[attr-defined]
    del unique  # (hold no reference to an item already yielded)
    return _yield_ended(ended, total, deadline)


class _Ended(Generic[W]):
    """The items that ended, in order, until ``as_completed`` is done with them.
    Then it holds none: an item that ends later (after a timeout) is dropped,
    not kept alive by the callback it still has."""

    __slots__ = ("open", "queue")

    def __init__(self) -> None:
        self.open = True
        self.queue: queue.SimpleQueue[W] = queue.SimpleQueue()

    def put(self, item: W) -> None:
        if self.open:
            self.queue.put(item)

    def close(self) -> None:
        self.open = False
        with contextlib.suppress(queue.Empty):
            while True:
                self.queue.get_nowait()


def _yield_ended(ended: _Ended[W], total: int, deadline: float | None) -> Iterator[W]:
    try:
        for yielded in range(total):
            # (Yielded straight from the call: no local keeps an item once handed out.)
            yield _next_ended(ended.queue, total - yielded, total, deadline)
    finally:
        ended.close()


def _next_ended(ended: queue.SimpleQueue[W], left: int, total: int, deadline: float | None) -> W:
    try:
        return ended.get(timeout=None if deadline is None else max(0.0, deadline - time.monotonic()))
    except queue.Empty:
        raise TimeoutError(f"{left} (of {total}) futures unfinished") from None
