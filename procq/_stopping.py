"""Ending jobs from outside: time limits, memory limits, ``q.cancel`` and
closing without waiting.

A mixin of ``Core`` (``_core.py``), split off to keep that module to the
claim / dispatch / finish cycle. Every method here takes ``Core.lock`` and only
decides: a running job is given its *kill reason* (the failure it will end
with, whatever its worker reports or however it dies after that) and its
worker is marked doomed; the supervisor's I/O thread does the killing. A job
that has not started ends here and now.
"""

from __future__ import annotations

import heapq
import threading
from collections import deque
from dataclasses import replace
from typing import TYPE_CHECKING, Any, Callable

from procq._entries import (
    PROCESSING,
    Entry,
    LaneState,
    WorkerSlot,
    current_timer,
    run_wakeups,
)
from procq._values import Completed, Failed, Failure

__all__ = ["Stopping"]

Wakeup = Callable[[], None]


class Stopping:
    lock: threading.Lock
    lanes: dict[str, LaneState]
    cancelled: bool
    memory_jobs: int
    _keys: dict[str, Any]
    _deadlines: list[tuple[float, int, Entry]]
    _timers: list[tuple[float, int, Entry]]
    _pending: int

    if TYPE_CHECKING:

        def _settle(self, entry: Entry, outcome: Completed[Any] | Failed, count: bool = True) -> list[Wakeup]: ...

        def _abandon(self, entry: Entry, why: str) -> list[Wakeup]: ...

        def _refill(self, lane: LaneState, wakeups: list[Wakeup]) -> None: ...

        def _feed(self, worker: WorkerSlot, batch: list[Entry], wakeups: list[Wakeup]) -> None: ...

    def expired(self, now: float) -> list[WorkerSlot]:
        """Workers whose job ran past its deadline; each is marked doomed, its
        job given a ``timeout`` kill reason. The caller kills them."""
        doomed: list[WorkerSlot] = []
        with self.lock:
            heap = self._deadlines
            while heap and heap[0][0] <= now:
                deadline, _, entry = heapq.heappop(heap)
                if entry.status != PROCESSING or entry.kill_reason is not None or entry.deadline != deadline:
                    continue
                worker = entry.worker
                if worker is None or worker.entry is not entry:
                    continue
                limit = entry.job.timeout
                whose = "its timeout"
                if limit is None:
                    limit, whose = entry.lane.spec.timeout, f"the timeout of lane {entry.lane.name!r}"
                entry.kill_reason = Failure(
                    "timeout",
                    f"job {entry.key!r} ran longer than {whose} of {limit:g}s; "
                    f"its worker (pid {worker.pid}) and that process's tree were killed",
                    pid=worker.pid,
                )
                worker.doomed = True
                doomed.append(worker)
        return doomed

    def memory_limited(self) -> list[tuple[WorkerSlot, Entry]]:
        """Running jobs with a memory limit, with their workers."""
        with self.lock:
            if not self.memory_jobs:
                return []
            return [
                (w, w.entry)
                for lane in self.lanes.values()
                for w in lane.workers
                if w.entry is not None and w.entry.memory_limit is not None and w.entry.kill_reason is None
            ]

    def decide_kill(self, worker: WorkerSlot, entry: Entry, failure: Failure) -> bool:
        """Decide that ``entry``, running on ``worker``, ends with ``failure``
        and its worker is killed. False if that was decided already, or the job
        has moved on meanwhile: then the caller must not kill the worker."""
        with self.lock:
            if worker.entry is not entry or entry.kill_reason is not None:
                return False
            entry.kill_reason = failure
            worker.doomed = True
            return True

    # --- cancelling -----------------------------------------------------------

    def cancel(self, key: str) -> tuple[bool, tuple[WorkerSlot, Entry] | None, tuple[WorkerSlot, int] | None]:
        """Cancel the live job of ``key``.

        A waiting job ends ``Failed("cancelled")`` now. A running one is given
        that as its kill reason and the caller must kill its worker (returned
        second, with the job: see ``spare``). A job sent ahead to a busy worker (``Core._top_up``) is given
        it too, and the caller must tell that worker to skip it (returned
        third: the worker and the job's id); it ends when the worker reports
        it skipped, or, had the worker started it already, when it reports its
        end. Returns (False, None, None) for an unknown or terminal key, or a
        job whose end was decided already (by a timeout, say).
        """
        wakeups: list[Wakeup] = []
        with self.lock:
            entry = self._keys.get(key)
            if type(entry) is not Entry or entry.kill_reason is not None:
                return False, None, None
            failure = Failure("cancelled", f"job {key!r} was cancelled by q.cancel()")
            if entry.status == PROCESSING:
                worker = entry.worker
                assert worker is not None
                entry.kill_reason = replace(
                    failure, message=f"{failure.message} while it ran; its worker's process tree was killed",
                    pid=worker.pid,
                )
                worker.doomed = True
                return True, (worker, entry), None
            lane = entry.lane
            if entry.worker is not None:  # sent ahead, not started
                entry.kill_reason = failure
                return True, None, (entry.worker, entry.job_id)
            if entry.timed:  # waiting for its not_before time or a retry's backoff
                self._pending -= 1
                wakeups = self._settle(entry, Failed(failure))  # (its timer goes stale)
            elif _remove(lane.ready, entry) or _remove(lane.overdue, entry):
                self._pending -= 1
                wakeups = self._settle(entry, Failed(failure))
                self._refill(lane, wakeups)
            else:
                for i, (blocked, wakeup) in enumerate(lane.blocked):
                    if blocked is entry:
                        del lane.blocked[i]
                        self._pending -= 1
                        wakeups = self._settle(entry, Failed(failure))
                        wakeups.append(wakeup)  # its push returns Queued; the handle says cancelled
                        break
                else:
                    # Claimed, and its push has not offered it yet: offer()
                    # ends it instead of queuing it.
                    entry.kill_reason = failure
        run_wakeups(wakeups)
        return True, None, None


    def spare(self, worker: WorkerSlot, cancelled: Entry) -> tuple[bool, list[Entry]]:
        """``q.cancel`` doomed ``worker`` to kill ``cancelled``, which it was
        running. Returns (True, []) if the kill must go ahead. If the job ended
        meanwhile (its report came first: it ends cancelled all the same), the
        worker is spared, since it may already run the next job it was sent
        ahead, which must not die for another job's cancel: it takes jobs
        again, and the ones to send it are returned (the caller holds the
        right to send them)."""
        wakeups: list[Wakeup] = []
        batch: list[Entry] = []
        with self.lock:
            held = worker.entry
            if worker.dead or worker.retired or held is cancelled or (held is not None and held.kill_reason is not None):
                return True, []
            worker.doomed = False
            self._feed(worker, batch, wakeups)
        run_wakeups(wakeups)
        return False, batch

    def cancel_all(self, why: str) -> list[WorkerSlot]:
        """Fail every waiting job as cancelled and doom every busy worker.
        Returns the workers the caller must kill."""
        doomed: list[WorkerSlot] = []
        wakeups: list[Wakeup] = []
        with self.lock:
            # From here on offer() refuses: a push that claimed its key just
            # before (and is still pickling) finds the door shut, not a worker.
            self.cancelled = True
            waiting = [item[2] for item in self._timers if current_timer(item)]
            self._timers.clear()
            for lane in self.lanes.values():
                waiting += lane.ready
                waiting += lane.overdue
                lane.ready.clear()
                lane.overdue.clear()
            for entry in waiting:
                self._pending -= 1
                wakeups += self._settle(entry, Failed(Failure("cancelled", f"job {entry.key!r} {why}")))
            for lane in self.lanes.values():
                for worker in lane.workers:
                    for entry in worker.queue:  # sent ahead, not started: they end here
                        entry.worker = None
                        self._pending -= 1
                        wakeups += self._settle(entry, Failed(Failure("cancelled", f"job {entry.key!r} {why}")))
                    lane.prefetched -= len(worker.queue)
                    worker.queue.clear()
                    held = worker.entry
                    if held is not None and held.kill_reason is None:
                        held.kill_reason = Failure("cancelled", f"job {held.key!r} {why}", pid=worker.pid)
                        worker.doomed = True
                        doomed.append(worker)
                # Blocked pushes are released here, not by their own threads
                # or tasks, which may never run again if the caller is one.
                for entry, wakeup in lane.blocked:
                    wakeups += self._abandon(entry, "the queue was closed without waiting")
                    wakeups.append(wakeup)
                lane.blocked.clear()
        run_wakeups(wakeups)
        return doomed


def _remove(queue: deque[Entry], entry: Entry) -> bool:
    try:
        queue.remove(entry)
    except ValueError:
        return False
    return True
