"""The engine's I/O-free core: the state map, the lanes' queues, every state change.

Both faces (the blocking one and the asyncio one in ``_queue.py``) and the
supervisor's I/O thread (``_supervisor.py``) change state only through the
methods here. Nothing here touches a pipe or a process: methods that decide
something another party must act on return it (a worker to send a job to, a
list of wake-ups to run) and the caller acts once the lock is released.

One lock
--------
``Core.lock`` guards everything below: the state map, each lane's queues and
worker slots, and each live entry's waiters. One lock, not a state-map lock
plus a waiter lock, because every transition touches both and two locks would
only add an ordering rule to get wrong. It is held for a few dict and deque
operations at a time; never across user code, pickling, a pipe send or an
await, and no wake-up (event set, callback, future resolution) runs under it.

Life of a key
-------------
::

    absent / Failed ──claim──> Pending ──assign──> Processing ──finish──> Completed | Failed
                                  │                     │
                                  │ abandon             │ (worker dies: Failed "crashed";
                                  v                     │  deadline: Failed "timeout")
                        back to what it was             v
                        (joiners: Failed "cancelled")   ...

``_keys[key]`` is an ``Entry`` while the key is live (Pending or
Processing) and the terminal state value (``Completed`` / ``Failed``) after.
"""

from __future__ import annotations

import heapq
import itertools
import threading
import time
from collections import deque
from dataclasses import replace
from typing import Any, Callable, Union

from procq._errors import QueueClosed
from procq._protocol import FnMirror
from procq._values import (
    Completed,
    Failed,
    Failure,
    Job,
    Lane,
    LaneStats,
    Pending,
    Processing,
    QueueStats,
    State,
)

__all__ = ["Core", "Entry", "LaneState", "WorkerSlot", "run_wakeups"]

Wakeup = Callable[[], None]

# An entry's status. PENDING: claimed, not yet given to a worker (it may still
# be waiting for room, or waiting in its lane). PROCESSING: a worker holds it.
# DONE: ``outcome`` is set and will never change. ABANDONED: DONE, but the claim
# never reached its lane: the key went back to what it was before the claim.
PENDING, PROCESSING, DONE, ABANDONED = 0, 1, 2, 3

_PENDING = Pending()
_PROCESSING = Processing()


class Entry:
    """One claim of a key: a job from its claim to its terminal state."""

    __slots__ = (
        "args_bytes",
        "callbacks",
        "deadline",
        "event",
        "fn_bytes",
        "fn_id",
        "job",
        "job_id",
        "kill_reason",
        "lane",
        "memory_limit",
        "outcome",
        "prev",
        "rss_base",
        "status",
        "worker",
    )

    def __init__(self, job: Job[Any], lane: LaneState, job_id: int, prev: Completed[Any] | Failed | None) -> None:
        self.job = job
        self.lane = lane
        self.job_id = job_id
        # What the key held before this claim; restored if the claim is abandoned.
        self.prev = prev
        self.status = PENDING
        # Completed | Failed once DONE; never changes after.
        self.outcome: Completed[Any] | Failed | None = None
        # Serialized once, by the pusher, before the entry enters its lane.
        self.fn_id = b""
        self.fn_bytes = b""
        self.args_bytes = b""
        # Waiters: a threading.Event made on demand by a blocking result(), and
        # callbacks from awaiting tasks. Both are fired with no lock held.
        self.event: threading.Event | None = None
        self.callbacks: list[Wakeup] | None = None
        self.deadline: float | None = None
        # The job's memory limit, or its lane's (bytes), and the worker's
        # resident memory when the job was sent (what the limit is on top of).
        self.memory_limit: int | None = job.memory_limit if job.memory_limit is not None else lane.spec.memory_limit_bytes
        self.rss_base = 0
        # Set when the job's end was decided from outside (timeout, memory,
        # q.cancel, close without waiting): the failure it ends with, whatever
        # the worker reports or however it dies after that.
        self.kill_reason: Failure | None = None
        # The worker holding it while PROCESSING.
        self.worker: WorkerSlot | None = None

    @property
    def key(self) -> str:
        return self.job.key

    def state(self) -> State:
        if self.outcome is not None:
            return self.outcome
        return _PROCESSING if self.status == PROCESSING else _PENDING


class WorkerSlot:
    """The core's view of one worker process: which job it holds, if any.

    ``process`` and ``conn`` are owned by the supervisor's I/O thread; the core
    only keeps them beside the slot's bookkeeping.
    """

    __slots__ = (
        "booting",
        "conn",
        "dead",
        "doomed",
        "entry",
        "fns",
        "fresh",
        "jobs",
        "lane",
        "pid",
        "process",
        "reader",
        "retired",
        "sending",
        "sentinel",
    )

    def __init__(self, lane: LaneState, process: Any, conn: Any, sentinel: Any = None, reader: Any = None) -> None:
        self.lane = lane
        self.process = process
        self.conn = conn
        # What the I/O thread waits on for the worker's death (a pidfd where
        # the platform has them), and for untrusted lanes the FrameReader.
        self.sentinel = sentinel if sentinel is not None else getattr(process, "sentinel", None)
        self.reader = reader
        self.pid: int | None = process.pid if process is not None else None
        self.entry: Entry | None = None
        # Mirror of the worker's function cache (see _protocol.FnMirror).
        self.fns = FnMirror()
        # Threads that have been given this worker's pipe to send on and have
        # not reported back yet. The pipe is closed only when this is 0, so a
        # descriptor is never closed (and reused) under a sender.
        self.sending = 0
        # doomed: the supervisor is killing it; it gets no more jobs.
        # dead: its death has been handled.
        self.doomed = False
        self.dead = False
        self.fresh = True  # has never been given a job
        self.jobs = 0  # jobs it has been given
        # retired: replaced between jobs (max_jobs_per_worker, max_worker_rss);
        # no longer in lane.workers, its replacement already counted.
        self.retired = False
        # Started, not yet READY: takes no job, so a worker that dies while it
        # starts (a signal, a main module that fails to import) fails none.
        self.booting = True


class LaneState:
    """A lane's limit, queues and counters."""

    __slots__ = (
        "blocked",
        "boot_failures",
        "completed",
        "crashes",
        "failed",
        "idle",
        "name",
        "ready",
        "restarts",
        "running",
        "spec",
        "starting",
        "workers",
    )

    def __init__(self, name: str, spec: Lane) -> None:
        self.name = name
        self.spec = spec
        # Jobs accepted into the lane, waiting for a worker: len(ready) <= capacity.
        self.ready: deque[Entry] = deque()
        # Pushes waiting for room, in arrival order, each with its wake-up.
        # Non-empty only while ready is full.
        self.blocked: deque[tuple[Entry, Wakeup]] = deque()
        self.workers: list[WorkerSlot] = []
        # Live workers holding no job. Non-empty only while ready is empty.
        self.idle: list[WorkerSlot] = []
        self.running = 0
        self.boot_failures = 0  # workers in a row that died before they were ready
        self.crashes = 0
        self.restarts = 0
        # Replacements decided on but whose process is not started yet: they
        # count as alive, so a waiter woken by a crash sees the lane whole.
        self.starting = 0
        self.completed = 0
        self.failed = 0


# Results of Core.offer.
QUEUED = "queued"  # accepted into the lane's ready queue
FULL = "full"  # no room; nothing changed
BLOCKED = "blocked"  # no room; the push now waits in the lane's blocked queue
STOPPED = "stopped"  # the supervisor has stopped: nothing will ever run the job
CANCELLED = "cancelled"  # q.cancel() came before the lane: the job ended, cancelled

Offer = Union[WorkerSlot, str]


class Core:
    """The state map and the lanes. Every method takes ``lock`` itself."""

    def __init__(self, lanes: dict[str, Lane]) -> None:
        self.lock = threading.Lock()
        self.lanes = {name: LaneState(name, spec) for name, spec in lanes.items()}
        self.default_lane = next(iter(self.lanes.values()))
        self._keys: dict[str, Entry | Completed[Any] | Failed] = {}
        self._ids = itertools.count(1)
        self.closing = False
        self.stopped = False  # the supervisor stopped: offer() refuses everything
        self.cancelled = False  # close(wait=False) began: offer() refuses everything
        # Counts of keys per state, kept in step with _keys (see _check_invariants).
        self._pending = 0
        self._processing = 0
        self._completed = 0
        self._failed = 0
        self._live = 0  # claims not yet DONE: pending (in a lane or not yet) or processing
        self.drained = threading.Event()  # set while closing and nothing is live
        # Deadlines of running jobs with a timeout: (deadline, job_id, entry).
        self._deadlines: list[tuple[float, int, Entry]] = []
        # Called (no lock held) when a new deadline may be earlier than the one
        # the I/O thread is sleeping towards.
        self.on_new_deadline: Wakeup = lambda: None
        # Running jobs with a memory limit: while there are any, the I/O
        # thread samples their process trees' memory.
        self.memory_jobs = 0

    # --- claiming -----------------------------------------------------------

    def lane_for(self, job: Job[Any]) -> LaneState:
        if job.lane is None:
            return self.default_lane
        lane = self.lanes.get(job.lane)
        if lane is None:
            known = ", ".join(repr(n) for n in self.lanes)
            raise ValueError(f"job {job.key!r}: unknown lane {job.lane!r}; this queue's lanes are {known}")
        return lane

    def claim(self, job: Job[Any], lane: LaneState) -> tuple[str, Any]:
        """Check and claim ``job.key`` in one critical section.

        Returns ("queued", new Entry), ("inflight", live Entry) or
        ("cached", output). A new entry is PENDING and in no lane yet: the
        caller must ``offer`` it or ``abandon`` it.
        """
        with self.lock:
            if self.closing:
                raise QueueClosed(f"the queue is closed; cannot push job {job.key!r}")
            current = self._keys.get(job.key)
            if type(current) is Entry:
                return "inflight", current
            if type(current) is Completed:
                return "cached", current.output
            entry = Entry(job, lane, next(self._ids), current)  # type: ignore[arg-type]
            self._keys[job.key] = entry
            if current is not None:
                self._failed -= 1
            self._pending += 1
            self._live += 1
            return "queued", entry

    def offer(self, entry: Entry, blocked_wakeup: Wakeup | None = None) -> Offer:
        """Hand a claimed entry to its lane.

        Returns the ``WorkerSlot`` the caller must now send the job to (an
        idle worker took it), ``QUEUED`` (it waits in the lane), or, when the
        lane is full, ``FULL`` (nothing changed) or, given ``blocked_wakeup``,
        ``BLOCKED``: the entry waits for room and ``blocked_wakeup`` runs once
        it has been accepted (see ``unblock``).
        """
        lane = entry.lane
        with self.lock:
            if self.stopped or self.cancelled:
                return STOPPED
            if entry.kill_reason is not None:  # cancelled while its push pickled it
                self._pending -= 1
                wakeups = self._settle(entry, Failed(entry.kill_reason))
                cancelled = True
            elif lane.idle:
                worker = lane.idle.pop()
                self._assign(worker, entry)
                wake = entry.deadline is not None or entry.memory_limit is not None
                cancelled = False
            elif len(lane.ready) < lane.spec.capacity:
                lane.ready.append(entry)
                return QUEUED
            elif blocked_wakeup is None:
                return FULL
            else:
                lane.blocked.append((entry, blocked_wakeup))
                return BLOCKED
        if cancelled:
            run_wakeups(wakeups)
            return CANCELLED
        if wake:
            self.on_new_deadline()
        return worker

    def unblock(self, entry: Entry, why: str) -> str:
        """A blocked push stops waiting. Returns "abandoned" when the entry
        never reached its lane: it was still blocked and its claim is now
        released (see ``_abandon``), or ``cancel_all`` released it. Returns
        "accepted" when the lane took it first: the push succeeded after all."""
        with self.lock:
            if entry.status == ABANDONED:
                return "abandoned"
            blocked = entry.lane.blocked
            for i, (e, _) in enumerate(blocked):
                if e is entry:
                    del blocked[i]
                    wakeups = self._abandon(entry, why)
                    break
            else:
                return "accepted"
        run_wakeups(wakeups)
        return "abandoned"

    def abandon(self, entry: Entry, why: str) -> None:
        """Release a claim that was never offered to its lane."""
        with self.lock:
            wakeups = self._abandon(entry, why)
        run_wakeups(wakeups)

    def _abandon(self, entry: Entry, why: str) -> list[Wakeup]:
        """Put the key back to what it was before ``entry`` claimed it, and
        wake whoever joined the claim with ``cancelled`` (lock held)."""
        assert entry.status == PENDING and entry.outcome is None
        if entry.prev is None:
            del self._keys[entry.key]
        else:
            self._keys[entry.key] = entry.prev
            self._failed += 1
        self._pending -= 1
        failure = Failure("cancelled", f"job {entry.key!r} was abandoned before it ran: {why}")
        wakeups = self._settle(entry, Failed(failure), count=False)
        entry.status = ABANDONED
        return wakeups

    # --- dispatch (lock held) -------------------------------------------------

    def _assign(self, worker: WorkerSlot, entry: Entry) -> None:
        entry.status = PROCESSING
        entry.prev = None  # past its lane's door: the claim can no longer be abandoned
        entry.worker = worker
        worker.entry = entry
        worker.fresh = False
        worker.jobs += 1
        worker.sending += 1
        entry.lane.running += 1
        self._pending -= 1
        self._processing += 1
        if entry.memory_limit is not None:
            self.memory_jobs += 1
        timeout = entry.job.timeout if entry.job.timeout is not None else entry.lane.spec.timeout
        if timeout is not None:
            entry.deadline = time.monotonic() + timeout
            heapq.heappush(self._deadlines, (entry.deadline, entry.job_id, entry))

    def _next_job(self, worker: WorkerSlot, wakeups: list[Wakeup]) -> Entry | None:
        """Give a free worker its next job, or park it idle (lock held)."""
        lane = worker.lane
        if worker.doomed or worker.dead or worker.booting:
            return None
        if lane.ready:
            entry = lane.ready.popleft()
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
        """Accept blocked pushes while the lane has room (lock held)."""
        while lane.blocked and len(lane.ready) < lane.spec.capacity:
            entry, wakeup = lane.blocked.popleft()
            lane.ready.append(entry)
            wakeups.append(wakeup)

    def doom(self, worker: WorkerSlot) -> None:
        """Give ``worker`` no more jobs: it is dying or being killed."""
        with self.lock:
            worker.doomed = True

    def sent(self, worker: WorkerSlot) -> bool:
        """A sender is done with ``worker``'s pipe. True: the worker died or
        was retired meanwhile and the caller, the last sender, must close the pipe."""
        with self.lock:
            worker.sending -= 1
            return (worker.dead or worker.retired) and worker.sending == 0

    # --- finishing ----------------------------------------------------------

    def _settle(self, entry: Entry, outcome: Completed[Any] | Failed, count: bool = True) -> list[Wakeup]:
        """Make ``outcome`` final for ``entry`` (lock held); return its wake-ups."""
        entry.outcome = outcome
        entry.status = DONE
        entry.worker = None
        entry.fn_bytes = entry.args_bytes = b""  # handles may live on; the payload need not
        self._live -= 1
        if count:
            self._keys[entry.key] = outcome
            if type(outcome) is Completed:
                self._completed += 1
                entry.lane.completed += 1
            else:
                self._failed += 1
                entry.lane.failed += 1
        wakeups: list[Wakeup] = []
        if entry.event is not None:
            wakeups.append(entry.event.set)
        if entry.callbacks:
            wakeups.extend(entry.callbacks)
            entry.callbacks = None
        if self._live == 0 and self.closing:
            wakeups.append(self.drained.set)
        return wakeups

    def job_done(
        self, worker: WorkerSlot, job_id: int, outcome: Completed[Any] | Failed, retire: bool = False
    ) -> tuple[Entry | None, str]:
        """A worker reported the end of its job. Returns the next job the
        caller must send to the same worker (or None), and "done"; "retire"
        when the worker must now be replaced (``retire``, or it has run its
        lane's ``max_jobs_per_worker``; see ``_retire``); "unexpected" when
        the report was not for the job the worker holds (a protocol violation:
        nothing changed)."""
        with self.lock:
            entry = worker.entry
            if entry is None or entry.job_id != job_id:
                return None, "unexpected"
            worker.entry = None
            self._processing -= 1
            entry.lane.running -= 1
            if entry.memory_limit is not None:
                self.memory_jobs -= 1
            if entry.kill_reason is not None:
                # Its end was decided (cancel, timeout, memory) before this
                # report arrived: it ends as decided, exactly once.
                outcome = Failed(entry.kill_reason)
            wakeups = self._settle(entry, outcome)
            limit = worker.lane.spec.max_jobs_per_worker
            if (retire or (limit is not None and worker.jobs >= limit)) and not worker.doomed:
                self._retire(worker)
                status, nxt = "retire", None
            else:
                status, nxt = "done", self._next_job(worker, wakeups)
        run_wakeups(wakeups)
        return nxt, status

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
                wakeups = self._settle(entry, Failed(failure))
            return worker.sending == 0, wakeups

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
            waiting = list(lane.ready)
            lane.ready.clear()
            wakeups: list[Wakeup] = []
            for entry in waiting:
                self._pending -= 1
                wakeups += self._settle(entry, Failed(failure(entry)))
            self._refill(lane, wakeups)
        run_wakeups(wakeups)

    # --- time limits --------------------------------------------------------

    def next_deadline(self) -> float | None:
        with self.lock:
            heap = self._deadlines
            while heap and heap[0][2].status != PROCESSING:
                heapq.heappop(heap)
            return heap[0][0] if heap else None

    def expired(self, now: float) -> list[WorkerSlot]:
        """Workers whose job ran past its deadline; each is marked doomed, its
        job given a ``timeout`` kill reason. The caller kills them."""
        doomed: list[WorkerSlot] = []
        with self.lock:
            heap = self._deadlines
            while heap and heap[0][0] <= now:
                _, _, entry = heapq.heappop(heap)
                if entry.status != PROCESSING or entry.kill_reason is not None:
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

    def cancel(self, key: str) -> tuple[bool, WorkerSlot | None]:
        """Cancel the live job of ``key``.

        A waiting job ends ``Failed("cancelled")`` now. A running one is given
        that as its kill reason and the caller must kill its worker (returned).
        Returns (False, None) for an unknown or terminal key, or a job whose
        end was decided already (by a timeout, say).
        """
        wakeups: list[Wakeup] = []
        with self.lock:
            entry = self._keys.get(key)
            if type(entry) is not Entry or entry.kill_reason is not None:
                return False, None
            failure = Failure("cancelled", f"job {key!r} was cancelled by q.cancel()")
            if entry.status == PROCESSING:
                worker = entry.worker
                assert worker is not None
                entry.kill_reason = replace(
                    failure, message=f"{failure.message} while it ran; its worker's process tree was killed",
                    pid=worker.pid,
                )
                worker.doomed = True
                return True, worker
            lane = entry.lane
            if _remove(lane.ready, entry):
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
        return True, None

    # --- closing ------------------------------------------------------------

    def stop(self) -> None:
        """The supervisor is stopping: no entry may enter a lane any more."""
        with self.lock:
            self.closing = True
            self.stopped = True

    def start_closing(self) -> None:
        with self.lock:
            self.closing = True
            if self._live == 0:
                self.drained.set()

    def cancel_all(self, why: str) -> list[WorkerSlot]:
        """Fail every waiting job as cancelled and doom every busy worker.
        Returns the workers the caller must kill."""
        doomed: list[WorkerSlot] = []
        wakeups: list[Wakeup] = []
        with self.lock:
            # From here on offer() refuses: a push that claimed its key just
            # before (and is still pickling) finds the door shut, not a worker.
            self.cancelled = True
            for lane in self.lanes.values():
                waiting = list(lane.ready)
                lane.ready.clear()
                for entry in waiting:
                    self._pending -= 1
                    wakeups += self._settle(entry, Failed(Failure("cancelled", f"job {entry.key!r} {why}")))
                for worker in lane.workers:
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

    # --- waiting on an entry ----------------------------------------------------

    def wait_event(self, entry: Entry) -> threading.Event | None:
        """An event set when ``entry`` is DONE, or None if it already is."""
        with self.lock:
            if entry.outcome is not None:
                return None
            if entry.event is None:
                entry.event = threading.Event()
            return entry.event

    def add_callback(self, entry: Entry, callback: Wakeup) -> bool:
        """Run ``callback`` (from some thread, no lock held) when ``entry`` is
        DONE. False, and nothing registered, if it already is."""
        with self.lock:
            if entry.outcome is not None:
                return False
            if entry.callbacks is None:
                entry.callbacks = []
            entry.callbacks.append(callback)
            return True

    # --- reading ------------------------------------------------------------

    def state(self, key: str) -> State | None:
        with self.lock:
            current = self._keys.get(key)
        if type(current) is Entry:
            return current.state()
        return current  # type: ignore[return-value]

    def stats(self) -> QueueStats:
        with self.lock:
            lanes = {
                name: LaneStats(
                    name=name,
                    workers=lane.spec.workers,
                    capacity=lane.spec.capacity,
                    waiting=len(lane.ready) + len(lane.blocked),
                    running=lane.running,
                    workers_alive=len(lane.workers) + lane.starting,
                    crashes=lane.crashes,
                    worker_restarts=lane.restarts,
                    completed=lane.completed,
                    failed=lane.failed,
                )
                for name, lane in self.lanes.items()
            }
            return QueueStats(
                pending=self._pending,
                processing=self._processing,
                completed=self._completed,
                failed=self._failed,
                lanes=lanes,
            )

    def live_count(self) -> int:
        with self.lock:
            return self._live

    def _check_invariants(self) -> None:
        """Assert the relations between fields that the code relies on (for tests)."""
        with self.lock:
            counts = {PENDING: 0, PROCESSING: 0}
            completed = failed = 0
            for key, value in self._keys.items():
                if type(value) is Entry:
                    assert value.key == key
                    assert value.outcome is None and value.status in (PENDING, PROCESSING), key
                    counts[value.status] += 1
                elif type(value) is Completed:
                    completed += 1
                else:
                    assert type(value) is Failed, (key, value)
                    failed += 1
            assert counts[PENDING] == self._pending, (counts, self._pending)
            assert counts[PROCESSING] == self._processing, (counts, self._processing)
            assert completed == self._completed and failed == self._failed
            for lane in self.lanes.values():
                assert len(lane.ready) <= lane.spec.capacity
                assert not lane.blocked or len(lane.ready) == lane.spec.capacity
                assert not lane.idle or not lane.ready, lane.name
                assert len(lane.workers) + lane.starting <= lane.spec.workers
                busy = [w for w in lane.workers if w.entry is not None]
                assert len(busy) == lane.running
                for w in lane.idle:
                    assert w.entry is None and w in lane.workers
                for w in busy:
                    assert w.entry is not None and w.entry.status == PROCESSING
                    assert self._keys.get(w.entry.key) is w.entry
                for e in lane.ready:
                    assert e.status == PENDING and self._keys.get(e.key) is e


def _remove(queue: deque[Entry], entry: Entry) -> bool:
    try:
        queue.remove(entry)
    except ValueError:
        return False
    return True


def run_wakeups(wakeups: list[Wakeup]) -> None:
    """Run wake-ups with no lock held; one failing never stops the others."""
    for wakeup in wakeups:
        try:
            wakeup()
        except Exception:  # pragma: no cover - a waiter's loop closed under it
            pass
