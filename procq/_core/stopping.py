"""Ending jobs from outside: time limits, memory limits, ``q.cancel`` and
closing without waiting.

``Stopping`` only decides, with ``Core.lock`` held: a running job is given
its *kill reason* (the failure it will end with, whatever its worker reports
or however it dies after that) and its worker is doomed
(``WorkerSlot.doom``); the supervisor's I/O thread does the killing. A job
that has not started ends here and now, through the state map.
"""

from __future__ import annotations

from collections import deque
from dataclasses import replace

from procq._core.dispatch import Dispatch
from procq._core.entries import PROCESSING, Entry, Wakeup, WorkerLife, WorkerSlot
from procq._core.statemap import StateMap
from procq._core.timers import Timers
from procq._model.values import Failed, Failure

__all__ = ["Stopping"]


class Stopping:
    """Time and memory limits, cancelling (see the module docstring)."""

    __slots__ = ("dispatch", "keys", "timers")

    def __init__(self, keys: StateMap, timers: Timers, dispatch: Dispatch) -> None:
        self.keys = keys
        self.timers = timers
        self.dispatch = dispatch

    def expired(self, now: float) -> list[WorkerSlot]:
        """Workers whose job ran past its deadline; each is doomed, its job
        given a ``timeout`` kill reason. The caller kills them."""
        doomed: list[WorkerSlot] = []
        for entry in self.timers.expired(now):
            worker = entry.worker
            if entry.kill_reason is not None or worker is None or worker.entry is not entry:
                continue
            limit = entry.timeout
            whose = "its timeout"
            if limit is None:
                limit, whose = entry.lane.spec.timeout, f"the timeout of lane {entry.lane.name!r}"
            entry.kill_reason = Failure(
                "timeout",
                f"job {entry.key!r} ran longer than {whose} of {limit:g}s; "
                f"its worker (pid {worker.pid}) and that process's tree were killed",
                pid=worker.pid,
            )
            worker.doom()
            doomed.append(worker)
        return doomed

    def memory_limited(self) -> list[tuple[WorkerSlot, Entry]]:
        """Running jobs with a memory limit, with their workers (on this machine)."""
        if not self.keys.memory_jobs:
            return []
        return [
            (w, w.entry)
            for lane in self.dispatch.lanes.values()
            for w in lane.workers
            if w.entry is not None
            and w.entry.memory_limit is not None
            and w.entry.kill_reason is None
            and not lane.spec.remote  # (measured where it runs)
        ]

    def decide_kill(self, worker: WorkerSlot, entry: Entry, failure: Failure) -> bool:
        """Decide that ``entry``, running on ``worker``, ends with ``failure``
        and its worker is killed. False if that was decided already, or the job
        has moved on meanwhile: then the caller must not kill the worker."""
        if worker.entry is not entry or entry.kill_reason is not None:
            return False
        entry.kill_reason = failure
        worker.doom()
        return True

    def cancel(
        self, key: str, now: float, wakeups: list[Wakeup]
    ) -> tuple[bool, tuple[WorkerSlot, Entry] | None, tuple[WorkerSlot, int] | None]:
        """Cancel the live job of ``key``.

        A waiting job ends ``Failed("cancelled")`` now. A running one is given
        that as its kill reason and the caller must kill its worker (returned
        second, with the job: see ``spare``). A job sent ahead to a busy worker
        is given it too, and the caller must tell that worker to skip it
        (returned third: the worker and the job's id); it ends when the worker
        reports it skipped, or, had the worker started it already, when it
        reports its end. Returns (False, None, None) for an unknown or
        terminal key, or a job whose end was decided already (by a timeout,
        say).
        """
        entry = self.keys.live.get(key)
        if entry is None or entry.kill_reason is not None:
            return False, None, None
        failure = Failure("cancelled", f"job {key!r} was cancelled by q.cancel()")
        if entry.status is PROCESSING:
            worker = entry.worker
            assert worker is not None
            entry.kill_reason = replace(
                failure,
                message=f"{failure.message} while it ran; its worker's process tree was killed",
                pid=worker.pid,
            )
            worker.doom()
            return True, (worker, entry), None
        lane = entry.lane
        if entry.worker is not None:  # sent ahead, not started
            entry.kill_reason = failure
            return True, None, (entry.worker, entry.job_id)
        if entry.timed:  # waiting for its not_before time or a retry's backoff
            wakeups += self.keys.settle(entry, Failed(failure), now)  # (its timer goes stale)
        elif _remove(lane.ready, entry) or _remove(lane.overdue, entry):
            wakeups += self.keys.settle(entry, Failed(failure), now)
            self.dispatch.refill(lane, wakeups)
        else:
            for i, (blocked, wakeup) in enumerate(lane.blocked):
                if blocked is entry:
                    del lane.blocked[i]
                    wakeups += self.keys.settle(entry, Failed(failure), now)
                    wakeups.append(wakeup)  # its push returns Queued; the handle says cancelled
                    break
            else:
                # Claimed, and its push has not offered it yet: offer() ends
                # it instead of queuing it.
                entry.kill_reason = failure
        return True, None, None

    def spare(
        self, worker: WorkerSlot, cancelled: Entry, now: float, batch: list[Entry], wakeups: list[Wakeup]
    ) -> bool:
        """``q.cancel`` doomed ``worker`` to kill ``cancelled``, which it was
        running. True if the kill must go ahead. If the job ended meanwhile
        (its report came first: it ends cancelled all the same), the worker is
        spared, since it may already run the next job it was sent ahead, which
        must not die for another job's cancel: it takes jobs again, and the
        ones to send it are put in ``batch`` (the caller holds the right to
        send them)."""
        held = worker.entry
        life = worker.life
        if (
            life is WorkerLife.DEAD
            or life is WorkerLife.RETIRED
            or held is cancelled
            or (held is not None and held.kill_reason is not None)
        ):
            return True
        if life is WorkerLife.DOOMED:
            worker.life = WorkerLife.READY
        self.dispatch.feed(worker, batch, now, wakeups)
        return False

    def cancel_all(self, why: str, now: float, wakeups: list[Wakeup]) -> list[WorkerSlot]:
        """Fail every waiting job as cancelled and doom every busy worker.
        Returns the workers the caller must kill."""
        keys = self.keys
        # From here on offer() refuses: a push that claimed its key just
        # before (and is still pickling) finds the door shut, not a worker.
        keys.cancelled = True
        doomed: list[WorkerSlot] = []
        waiting = self.timers.take_waiting()
        lanes = self.dispatch.lanes.values()
        for lane in lanes:
            waiting += lane.ready
            waiting += lane.overdue
            lane.ready.clear()
            lane.overdue.clear()
        for entry in waiting:
            wakeups += keys.settle(entry, Failed(Failure("cancelled", f"job {entry.key!r} {why}")), now)
        for lane in lanes:
            for worker in lane.workers:
                for entry in worker.queue:  # sent ahead, not started: they end here
                    entry.worker = None
                    wakeups += keys.settle(entry, Failed(Failure("cancelled", f"job {entry.key!r} {why}")), now)
                lane.prefetched -= len(worker.queue)
                worker.queue.clear()
                held = worker.entry
                if held is not None and held.kill_reason is None:
                    held.kill_reason = Failure("cancelled", f"job {held.key!r} {why}", pid=worker.pid)
                    worker.doom()
                    doomed.append(worker)
            # Blocked pushes are released here, not by their own threads or
            # tasks, which may never run again if the caller is one.
            for entry, wakeup in lane.blocked:
                wakeups += keys.abandon(entry, "the queue was closed without waiting", now)
                wakeups.append(wakeup)
            lane.blocked.clear()
        return doomed


def _remove(queue: deque[Entry], entry: Entry) -> bool:
    try:
        queue.remove(entry)
    except ValueError:
        return False
    return True
