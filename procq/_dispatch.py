"""Dispatch: handing jobs to workers, and what a worker's reports and death do.

A mixin of ``Core`` (``_core.py``), split off to keep that module to the state
map and a key's life. Everything here runs with ``Core.lock`` held, or takes it:
which worker runs which job, which jobs are sent ahead to a busy worker and
what becomes of them, a lane's room for waiting pushes, and a worker's start,
retirement and death. Like the rest of the core it never touches a pipe or a
process: it returns the jobs to send, and the caller sends them.

Several jobs in flight per worker
---------------------------------
While a lane's jobs are short (``PIPELINE_WINDOW``) and some wait, a busy
worker is sent jobs ahead of the one it runs (``WorkerSlot.queue``), in one
frame; they are still Pending and count against the lane's capacity. A worker
runs them in order and reports each as it ends, so the supervisor always knows
which one runs: the first it has not heard back about. If the worker dies,
that one fails; the others never started and go back to the front of their
lane (``_requeue``). A job with a time or memory limit is never sent ahead, nor
behind one, so its limit counts from its real start.
"""

from __future__ import annotations

import heapq
import threading
import time
from dataclasses import replace
from typing import TYPE_CHECKING, Any, Callable

from procq._entries import (
    PROCESSING,
    Entry,
    LaneState,
    WorkerSlot,
    run_wakeups,
)
from procq._protocol import Report, Status
from procq._values import Completed, Failed, Failure

if TYPE_CHECKING:
    from procq._retention import Keeper

__all__ = ["PIPELINE_DEPTH", "PIPELINE_WINDOW", "Dispatch"]

Wakeup = Callable[[], None]

#: A lane whose jobs run for less than this (on average, lately) has jobs sent
#: ahead to its busy workers: enough to keep each busy for about this long.
PIPELINE_WINDOW = 0.005
#: At most this many jobs in flight to one worker (the running one included).
PIPELINE_DEPTH = 16


class Dispatch:
    lock: threading.Lock
    keeper: Keeper
    memory_jobs: int
    _pending: int
    _processing: int
    _deadlines: list[tuple[float, int, Entry]]
    _handoffs: list[tuple[WorkerSlot, Entry]]
    on_new_deadline: Wakeup

    if TYPE_CHECKING:

        def _settle(self, entry: Entry, outcome: Completed[Any] | Failed, count: bool = True) -> list[Wakeup]: ...

        def _end(self, entry: Entry, outcome: Completed[Any] | Failed) -> list[Wakeup]: ...

    def _assign(self, worker: WorkerSlot, entry: Entry) -> None:
        """Start ``entry`` on ``worker``; the caller sends it (lock held)."""
        self._start(worker, entry)
        worker.sending += 1

    def _start(self, worker: WorkerSlot, entry: Entry) -> None:
        """``entry`` is now the job ``worker`` runs (lock held)."""
        entry.status = PROCESSING
        if entry.prev is not None:  # past its lane's door: the claim can no longer be abandoned
            self.keeper.dropped(entry.prev)
            entry.prev = None
        entry.worker = worker
        worker.entry = entry
        worker.fresh = False
        worker.jobs += 1
        worker.started = time.monotonic()
        entry.lane.running += 1
        self._pending -= 1
        self._processing += 1
        if entry.memory_limit is not None:
            self.memory_jobs += 1
        timeout = entry.job.timeout if entry.job.timeout is not None else entry.lane.spec.timeout
        if timeout is not None:
            entry.deadline = time.monotonic() + timeout
            heapq.heappush(self._deadlines, (entry.deadline, entry.job_id, entry))

    def _enter_lane(self, entry: Entry) -> WorkerSlot | None:
        """A claimed entry whose time has come goes to its lane: to an idle
        worker (returned: the caller sends it), into ready, or into overdue
        when ready is full (lock held)."""
        lane = entry.lane
        if lane.idle:
            worker = lane.idle.pop()
            self._assign(worker, entry)
            return worker
        if len(lane.ready) + lane.prefetched < lane.spec.capacity:
            lane.ready.append(entry)
        else:
            lane.overdue.append(entry)
        return None

    def _next_job(self, worker: WorkerSlot, wakeups: list[Wakeup]) -> Entry | None:
        """Give a free worker its next job, or park it idle (lock held)."""
        lane = worker.lane
        if worker.doomed or worker.dead or worker.booting:
            return None
        if lane.ready:
            entry = lane.ready.popleft()
        elif lane.overdue:  # only with capacity 0
            entry = lane.overdue.popleft()
        elif lane.blocked:  # only with capacity 0: hand over directly
            entry, wakeup = lane.blocked.popleft()
            wakeups.append(wakeup)
        elif worker.fresh:
            # A new worker goes to the back of the idle list (idle.pop() takes
            # from the end): the warmest workers get work first.
            lane.idle.insert(0, worker)
            return None
        else:
            lane.idle.append(worker)
            return None
        self._refill(lane, wakeups)
        self._assign(worker, entry)
        return entry

    def _refill(self, lane: LaneState, wakeups: list[Wakeup]) -> None:
        """Move overdue jobs, then blocked pushes, into ready while the lane
        has room (lock held).

        Blocked pushes are let in only once the lane has drained to its low
        mark (``_low_mark``), then as many as fit: a thread pushing into a
        full lane then sleeps once per many jobs, not once per job (each
        sleep is an Event and a thread switch, most of a tiny job's cost)."""
        capacity = lane.spec.capacity - lane.prefetched
        while lane.overdue and len(lane.ready) < capacity:
            lane.ready.append(lane.overdue.popleft())
        if not lane.blocked or len(lane.ready) + lane.prefetched > _low_mark(lane.spec.capacity):
            return
        while lane.blocked and len(lane.ready) < capacity:
            entry, wakeup = lane.blocked.popleft()
            lane.ready.append(entry)
            wakeups.append(wakeup)

    def doom(self, worker: WorkerSlot) -> None:
        """Give ``worker`` no more jobs: it is dying or being killed."""
        with self.lock:
            worker.doomed = True

    def sent(self, worker: WorkerSlot, n: int = 1) -> bool:
        """A sender is done with ``worker``'s pipe (``n`` rights to send, used
        for one frame). True: the worker died or was retired meanwhile and the
        caller, the last sender, must close the pipe."""
        with self.lock:
            worker.sending -= n
            return (worker.dead or worker.retired) and worker.sending == 0

    def job_done(
        self,
        worker: WorkerSlot,
        job_id: int,
        outcome: Completed[Any] | Failed,
        retire: bool = False,
        wakeups: list[Wakeup] | None = None,
        crashed: bool = False,
    ) -> tuple[list[Entry], Status]:
        """A worker reported the end of its job: ``jobs_done`` for one report.
        ``crashed``: ``outcome`` is a crash (an untrusted lane's job whose own
        process died under it), counted in the lane's stats."""
        batch, status, _ = self.jobs_done(worker, [Report(job_id, outcome, retire, crashed)], wakeups)
        return batch, status

    def jobs_done(
        self,
        worker: WorkerSlot,
        reports: list[Report],
        wakeups: list[Wakeup] | None = None,
    ) -> tuple[list[Entry], Status, int]:
        """A worker reported the end of its jobs, in the order it ran them:
        a ``Report`` each (``retire``: the worker
        must be replaced after it; ``crashed``: count it as a crash). All are settled in one critical section.

        The worker's next job is the first of its queue, if it has one: it
        has already started it. Returns the jobs the caller must now send to
        the same worker (in one frame; empty: none; the caller holds one right
        to send for them), how many reports were taken, and ``Status.DONE``; ``RETIRE``
        when the worker must now be replaced (a report asked for it, or it has
        run its lane's ``max_jobs_per_worker``; see ``_retire``); or
        ``UNEXPECTED`` when a report was not for the job the worker holds (a
        protocol violation: the reports from that one on changed nothing).

        Given ``wakeups``, the jobs' wake-ups are added to it for the caller
        to run (after it has sent the worker its next jobs, and once for all
        the reports it read at once); else they are run here."""
        deferred = wakeups
        wakeups = []
        batch: list[Entry] = []
        status = Status.DONE
        taken = 0
        with self.lock:
            lane = worker.lane
            now = time.monotonic()
            for job_id, outcome, retire, crashed in reports:
                entry = worker.entry
                if entry is None or entry.job_id != job_id:
                    status = Status.UNEXPECTED
                    break
                taken += 1
                ran = now - worker.started
                lane.service = ran if lane.service is None else 0.8 * lane.service + 0.2 * ran
                worker.entry = None
                self._processing -= 1
                lane.running -= 1
                if entry.memory_limit is not None:
                    self.memory_jobs -= 1
                if entry.kill_reason is not None:
                    # Its end was decided (cancel, timeout, memory) before this
                    # report arrived: it ends as decided, exactly once.
                    outcome = Failed(entry.kill_reason)
                elif crashed:
                    lane.crashes += 1
                wakeups += self._end(entry, outcome)
                if worker.queue:
                    if retire:
                        worker.retire_pending = True  # once its queue has run
                    nxt = worker.queue.popleft()
                    lane.prefetched -= 1
                    self._start(worker, nxt)
                    worker.started = now
                    continue
                limit = lane.spec.max_jobs_per_worker
                retire = retire or worker.retire_pending or (limit is not None and worker.jobs >= limit)
                if retire and not worker.doomed:
                    self._retire(worker)
                    status = Status.RETIRE
                    break
            if status is Status.DONE:
                self._feed(worker, batch, wakeups)
        if deferred is None:
            run_wakeups(wakeups)
        else:
            deferred += wakeups
        return batch, status, taken

    def _feed(self, worker: WorkerSlot, batch: list[Entry], wakeups: list[Wakeup]) -> None:
        """Put in ``batch`` the jobs a worker that can take work is to be sent
        now, in one frame, and hold the right to send them (lock held): jobs
        ahead of the one it runs, or, idle, its next job and those ahead of it
        (or park it idle). Then let blocked pushes into the room made."""
        if worker.entry is not None:
            self._top_up(worker, batch)
            if batch:
                worker.sending += 1
        else:
            first = self._next_job(worker, wakeups)  # (holds the right to send)
            if first is not None:
                batch.append(first)
                self._top_up(worker, batch)
        self._refill(worker.lane, wakeups)

    def _top_up(self, worker: WorkerSlot, batch: list[Entry]) -> None:
        """Send short jobs ahead to a busy worker (lock held): while its lane's
        jobs run for less than ``PIPELINE_WINDOW`` on average, keep up to
        ``PIPELINE_DEPTH`` jobs in flight to it, so it goes from one to the
        next without waiting for the supervisor. Never for untrusted lanes,
        and never a job with a time or memory limit, or behind one: those
        start only on a worker with nothing queued, so their limits count
        from their real start."""
        lane = worker.lane
        spec = lane.spec
        running = worker.entry
        if (
            lane.service is None
            or running is None
            or not spec.trusted
            or worker.doomed
            or worker.retire_pending
            or running.deadline is not None
            or running.memory_limit is not None
        ):
            return
        depth = min(PIPELINE_DEPTH - 1, int(PIPELINE_WINDOW / max(lane.service, 1e-6)))
        if len(worker.queue) > depth // 2:
            return  # topped up when half run: one frame for several jobs
        room = depth - len(worker.queue)
        if spec.max_jobs_per_worker is not None:
            room = min(room, spec.max_jobs_per_worker - worker.jobs - len(worker.queue))
        ready = lane.ready
        while room > 0 and ready:
            entry = ready[0]
            if entry.job.timeout is not None or spec.timeout is not None or entry.memory_limit is not None:
                break
            ready.popleft()
            entry.worker = worker
            worker.queue.append(entry)
            lane.prefetched += 1
            batch.append(entry)
            room -= 1

    def _retire(self, worker: WorkerSlot) -> None:
        """Take an idle worker out of its lane and reserve its replacement
        (lock held). The caller closes its pipe; it exits on EOF."""
        lane = worker.lane
        worker.doomed = worker.retired = True
        lane.workers.remove(worker)
        lane.starting += 1
        lane.restarts += 1

    def worker_died(
        self,
        worker: WorkerSlot,
        crash: Callable[[Entry], Failure],
        exitcode: int | None = None,
        signal: str | None = None,
        restart: bool = False,
    ) -> tuple[bool, list[Wakeup]]:
        """A worker's death was seen. Its job (if any) fails with ``crash(entry)``,
        or with the ``kill_reason`` the supervisor gave it before killing it
        (completed with how the worker died). Returns whether the caller must
        close the worker's pipe now (no sender holds it), and the wake-ups the
        caller must run (``run_wakeups``). With ``restart``, a replacement is
        reserved (see ``reserve_restart``) in the same step, so that a woken
        waiter finds the lane whole again."""
        with self.lock:
            if worker.dead:
                return False, []
            worker.dead = True
            lane = worker.lane
            if worker in lane.idle:
                lane.idle.remove(worker)
            if not worker.retired:
                lane.workers.remove(worker)
            entry = worker.entry
            worker.entry = None
            wakeups: list[Wakeup] = []
            self._requeue(worker, wakeups)
            if worker.booting:
                lane.boot_failures += 1
            if restart:
                lane.starting += 1
                lane.restarts += 1
            if entry is not None:
                self._processing -= 1
                lane.running -= 1
                if entry.memory_limit is not None:
                    self.memory_jobs -= 1
                failure = entry.kill_reason
                if failure is None:
                    failure = crash(entry)
                    lane.crashes += 1
                else:
                    failure = replace(failure, exitcode=exitcode, signal=signal)
                wakeups = self._end(entry, Failed(failure))
            return worker.sending == 0, wakeups

    def _requeue(self, worker: WorkerSlot, wakeups: list[Wakeup]) -> None:
        """A dead worker's queued jobs never started: back to the front of
        their lane, in order (a cancelled one just ends), and to an idle
        worker if there is one (lock held; see ``handoffs``)."""
        if not worker.queue:
            return
        lane = worker.lane
        queued = list(worker.queue)
        worker.queue.clear()
        lane.prefetched -= len(queued)
        for entry in reversed(queued):
            entry.worker = None
            if entry.kill_reason is not None:
                self._pending -= 1
                wakeups += self._settle(entry, Failed(entry.kill_reason))
            else:
                lane.ready.appendleft(entry)
        while lane.idle and lane.ready:
            idle = lane.idle.pop()
            first = lane.ready.popleft()
            self._assign(idle, first)
            self._handoffs.append((idle, first))

    def handoffs(self) -> list[tuple[WorkerSlot, Entry]]:
        """Jobs given to idle workers by ``worker_died`` (a dead worker's
        queue): the I/O thread sends them."""
        with self.lock:
            sends, self._handoffs = self._handoffs, []
            return sends

    def reserve_restart(self, lane: LaneState) -> None:
        """A replacement worker for ``lane`` is about to be started."""
        with self.lock:
            lane.starting += 1
            lane.restarts += 1

    def add_worker(self, worker: WorkerSlot | None, lane: LaneState, reserved: bool) -> None:
        """A new worker process joined ``lane`` (``None``: starting it failed).
        It takes jobs once ready. ``reserved``: it was counted by ``reserve_restart``."""
        with self.lock:
            if reserved:
                lane.starting -= 1
            if worker is not None:
                lane.workers.append(worker)
            elif reserved:
                lane.restarts -= 1

    def worker_ready(self, worker: WorkerSlot) -> Entry | None:
        """A worker finished starting. Returns a job to send it, if one waits."""
        with self.lock:
            worker.booting = False
            worker.lane.boot_failures = 0
            wakeups: list[Wakeup] = []
            nxt = self._next_job(worker, wakeups)
            wake = nxt is not None and (nxt.deadline is not None or nxt.memory_limit is not None)
        run_wakeups(wakeups)
        if wake:
            self.on_new_deadline()
        return nxt

    def fail_waiting(self, lane: LaneState, failure: Callable[[Entry], Failure]) -> None:
        """Fail every job waiting in ``lane`` (its workers cannot start), so
        that no handle waits forever on a lane that cannot run anything."""
        with self.lock:
            waiting = [*lane.ready, *lane.overdue]
            lane.ready.clear()
            lane.overdue.clear()
            wakeups: list[Wakeup] = []
            for entry in waiting:
                self._pending -= 1
                wakeups += self._settle(entry, Failed(failure(entry)))
            self._refill(lane, wakeups)
        run_wakeups(wakeups)

def _low_mark(capacity: int) -> int:
    """How far a full lane drains before its blocked pushes are let in: a
    quarter of a large lane; a small lane takes one as soon as there is room."""
    return capacity - capacity // 4 if capacity >= 16 else capacity - 1
