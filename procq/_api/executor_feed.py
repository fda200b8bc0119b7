"""``procq.Executor``'s call queue: its calls handed to the ``ProcQueue``, a lane's workers + 1 ahead.

``ProcessPoolExecutor`` moves a submitted call into its *call queue* (a pipe
its workers read) only while that queue holds fewer than ``max_workers + 1``
calls; from then on the future is RUNNING and ``cancel()`` refuses, and
``shutdown(cancel_futures=True)`` cancels only the calls still waiting in the
executor. ``Feed`` does the same over a ``ProcQueue``: per lane, at most the
lane's workers + 1 of the executor's jobs are in the queue (pushed and not
ended); the rest wait here, in submission order, as plain PENDING futures.

Why not push every call at once and let the lane hold them: then every call
would be "handed over" the moment it is submitted and
``shutdown(cancel_futures=True)`` could only cancel what the lane still holds
(all of it, just after a burst of submits, even the calls a
``ProcessPoolExecutor`` would have run), or nothing. Why a thread: a job that
ends makes room from whichever thread ended it (often procq's I/O thread,
which must not pickle user objects or block), so the next push runs on the
feeder thread, as ``ProcessPoolExecutor``'s manager thread fills its call
queue. A submit that finds room (and nobody waiting before it) pushes from
the caller's thread at once, and no feeder thread is started until a call
has to wait.
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Callable, Mapping
from typing import Any

from procq._api.futures import JobFuture
from procq._model.job import Job

__all__ = ["Call", "Feed"]


class Call:
    """A submitted call: its job and its future (``mine``: the key is generated, to forget)."""

    __slots__ = ("future", "job", "lane", "mine")

    def __init__(self, job: Job[Any], lane: str, future: JobFuture[Any], mine: bool) -> None:
        self.job = job
        self.lane = lane
        self.future = future
        self.mine = mine


class Feed:
    """The calls waiting for room in their lane, and the thread that hands them over.

    ``push`` hands one call to the queue (it resolves the call's future should
    the push fail); it is called with no lock held, from the submitting thread
    or the feeder thread. Lock order: ``_lock`` is never held across ``push``
    or any future's method.
    """

    def __init__(self, windows: Mapping[str, int], push: Callable[[Call], None]) -> None:
        self._push = push
        self._lock = threading.Lock()
        self._changed = threading.Condition(self._lock)
        self._windows = dict(windows)
        # Per lane: how many more of the executor's jobs may be in the queue
        # (0 <= room <= window: a job counts from its hand-over to its end).
        self._room = dict(windows)
        # Per lane: the calls waiting for room, oldest first.
        self._waiting: dict[str, deque[Call]] = {lane: deque() for lane in windows}
        # The feeder thread, while calls wait (it ends once none does, so that it
        # never keeps a dropped executor alive; the next wait starts another).
        self._thread: threading.Thread | None = None

    def submit(self, call: Call) -> bool:
        """True if the caller is to push ``call`` now (its lane had room and no
        call waited before it); else it waits here for the feeder."""
        with self._lock:
            waiting = self._waiting[call.lane]
            if not waiting and self._room[call.lane] > 0:
                self._room[call.lane] -= 1
                return True
            waiting.append(call)
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="procq-executor-feed", daemon=True)
                self._thread.start()
            self._changed.notify()
            return False

    def ended(self, lane: str) -> None:
        """A job of the executor's in ``lane`` ended: room for the next (quick, never blocks)."""
        with self._lock:
            self._room[lane] += 1
            if self._waiting[lane]:
                self._changed.notify()

    def take_waiting(self) -> list[Call]:
        """Every call still waiting, taken out (for ``shutdown(cancel_futures=True)``)."""
        with self._lock:
            calls = [call for waiting in self._waiting.values() for call in waiting]
            for waiting in self._waiting.values():
                waiting.clear()
            self._changed.notify()
        return calls

    def drain(self) -> None:
        """Return once every waiting call is handed over (the executor takes no
        more submissions by then)."""
        with self._lock:
            thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join()

    def check_invariants(self) -> None:
        """Assert what the fields' comments say (for tests)."""
        with self._lock:
            for lane, window in self._windows.items():
                assert 0 <= self._room[lane] <= window, (lane, self._room[lane], window)
            assert self._thread is not None or not any(self._waiting.values()), "calls wait with no feeder"

    def _next(self) -> Call | None:
        """The next call to hand over, waiting until one has room; None (and
        the thread ends) once none waits."""
        with self._lock:
            while True:
                for lane, waiting in self._waiting.items():
                    if waiting and self._room[lane] > 0:
                        self._room[lane] -= 1
                        return waiting.popleft()
                if not any(self._waiting.values()):
                    self._thread = None
                    return None
                self._changed.wait()

    def _run(self) -> None:
        while (call := self._next()) is not None:
            self._push(call)
            del call  # (no reference to a call's arguments outlives its push)
