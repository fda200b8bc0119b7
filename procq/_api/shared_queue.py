"""One ``ProcQueue`` a process shares between calls with the same settings, as
loky's reusable executor is shared between joblib's ``Parallel`` calls.

Why: opening a queue starts its workers, and each then imports what its jobs
need; a library that opens a queue per call (joblib's backend, called by
scikit-learn at every ``n_jobs`` fit) pays that at every call. A
``SharedQueue`` keeps the queue its last call used, and hands it to the next
call whose settings are the same (``same_settings``).

Who may use it: any thread. ``acquire`` and ``release`` bracket a call. The
queue, its settings and the count of calls using it (``_users``) are under
``_lock``, which is also held while the shared queue is replaced (the idle
one closed first, so two sets of workers never compete for the CPUs, then
the new one opened: a second call must not open another meanwhile). A call
whose settings differ from those of the shared queue gets it replaced while
no call uses it, and a private queue of its own while one does (closed at
its ``release``): never a queue closed under a running call.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable
from typing import Any

from procq._api.queue import ProcQueue
from procq._model.job import Lane

__all__ = ["SharedQueue", "same_settings"]


def same_settings(old: tuple[Any, ...], new: tuple[Any, ...]) -> bool:
    """Settings ``(initializer, initargs, *rest)`` that ask for the same
    queue: the initializer and its arguments the same objects (never compared
    by value: arguments may be arrays), the rest equal."""
    return len(old) == len(new) and old[0] is new[0] and old[1] is new[1] and old[2:] == new[2:]


class SharedQueue:
    """The process's one reusable queue of a lane named ``lane``."""

    def __init__(self, lane: str) -> None:
        self.lane = lane
        self._lock = threading.Lock()
        self._queue: ProcQueue | None = None  # under _lock
        self._settings: tuple[Any, ...] = ()  # what _queue was opened with; under _lock
        self._users = 0  # calls that acquired _queue and have not released it; under _lock
        # A child made by fork starts afresh: its parent's queue is not its
        # own, and _lock may have been held by a thread the child has not.
        os.register_at_fork(after_in_child=self._forget)

    def acquire(self, settings: tuple[Any, ...], lane: Callable[[], Lane], start_method: str | None) -> ProcQueue:
        """A queue opened with ``settings`` (its one lane made by ``lane()``):
        the shared one, reused, or opened in place of an idle one with other
        settings; or, while another call uses the shared one and the
        settings differ, a private one."""
        with self._lock:
            if self._queue is not None and same_settings(self._settings, settings):
                self._users += 1
                return self._queue
            if self._queue is None or self._users == 0:
                idle, self._queue, self._users = self._queue, None, 0
                if idle is not None:
                    idle.close(wait=False)
                shared = ProcQueue({self.lane: lane()}, start_method=start_method)
                self._queue, self._settings, self._users = shared, settings, 1
                return shared
        return ProcQueue({self.lane: lane()}, start_method=start_method)

    def _forget(self) -> None:
        self._lock = threading.Lock()
        self._queue, self._settings, self._users = None, (), 0

    def release(self, q: ProcQueue) -> None:
        """A call is done with ``q``; a private one is closed."""
        with self._lock:
            if q is self._queue:
                self._users -= 1
                return
        q.close(wait=False)

    def shutdown(self) -> None:
        """Close the shared queue (a call still using it sees it closed)."""
        with self._lock:
            q, self._queue, self._settings, self._users = self._queue, None, (), 0
        if q is not None:
            q.close(wait=False)
