"""The core's bookkeeping objects: a claim (``Entry``), a worker (``WorkerSlot``),
a lane (``LaneState``). ``Core`` (``_core.py``) changes them, under its lock;
nothing here takes a lock or does I/O.
"""

from __future__ import annotations

import threading
from collections import deque
from typing import TYPE_CHECKING, Any, Callable

from procq._job import Job, Lane
from procq._values import (
    Completed,
    Failed,
    Failure,
    Pending,
    Processing,
    State,
)

if TYPE_CHECKING:
    from procq._channel import WorkerChannel
    from procq._retention import Record

__all__ = ["ABANDONED", "DONE", "PENDING", "PROCESSING", "Ended", "Entry", "LaneState", "WorkerSlot", "current_timer", "run_wakeups"]

Wakeup = Callable[[], None]

# An entry's status. PENDING: claimed, not yet given to a worker (it may still
# be waiting for room, for its time, or in its lane). PROCESSING: a worker
# holds it. DONE: ``outcome`` is set and will never change. ABANDONED: DONE,
# but the claim never reached its lane: the key went back to what it was
# before the claim.
PENDING, PROCESSING, DONE, ABANDONED = 0, 1, 2, 3

_PENDING = Pending()
_PROCESSING = Processing()


class Entry:
    """One claim of a key: a job from its claim to its terminal state, through
    every attempt (a retried job keeps its entry, so its handles keep waiting)."""

    __slots__ = (
        "args_bytes",
        "attempt",
        "callbacks",
        "deadline",
        "due",
        "event",
        "fn_bytes",
        "fn_id",
        "fp",
        "history",
        "job",
        "job_id",
        "kill_reason",
        "lane",
        "memory_limit",
        "outcome",
        "prev",
        "rss_base",
        "status",
        "timed",
        "worker",
    )

    def __init__(self, job: Job[Any], lane: LaneState, job_id: int, prev: Record | None) -> None:
        self.job = job
        self.lane = lane
        # Changes with each attempt: a worker's report names the attempt it ran.
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
        # The job's fingerprint (see _fingerprint), None when not checked.
        self.fp: bytes | None = None
        # Waiters: a threading.Event made on demand by a blocking result(), and
        # callbacks from awaiting tasks. Both are fired with no lock held.
        self.event: threading.Event | None = None
        self.callbacks: list[Wakeup] | None = None
        self.deadline: float | None = None
        # The job's memory limit, or its lane's (bytes), and the worker's
        # resident memory when the job was sent (what the limit is on top of).
        self.memory_limit: int | None = job.memory_limit if job.memory_limit is not None else lane.spec.memory_limit_bytes
        self.rss_base = 0
        # Set when the attempt's end was decided from outside (timeout, memory,
        # q.cancel, close without waiting): the failure it ends with, whatever
        # the worker reports or however it dies after that.
        self.kill_reason: Failure | None = None
        # The worker holding it while PROCESSING.
        self.worker: WorkerSlot | None = None
        # The attempt that runs next (or runs now), from 1; earlier attempts' failures.
        self.attempt = 1
        self.history: list[Failure] | None = None
        # When it may enter its lane (monotonic clock), while PENDING and not
        # yet there: a not_before time or a retry backoff. None: at once.
        self.due: float | None = None
        # In Core._timers, waiting for ``due`` (invariant: timed => due is not None).
        self.timed = False

    @property
    def key(self) -> str:
        return self.job.key

    def state(self) -> State:
        if self.outcome is not None:
            return self.outcome
        if self.status == PROCESSING:
            return _PROCESSING
        return _PENDING if self.attempt == 1 else Pending(attempt=self.attempt)


class Ended:
    """Stands in for an entry that ended long ago, so a handle can be made on a
    key that is only a record now (``q.handles()``, ``reuse="never"``)."""

    __slots__ = ("key", "outcome")

    status = DONE

    def __init__(self, key: str, outcome: Completed[Any] | Failed) -> None:
        self.key = key
        self.outcome = outcome

    def state(self) -> State:
        return self.outcome


class WorkerSlot:
    """The core's view of one worker process: which job it holds, if any.

    ``channel`` (a ``_channel.WorkerChannel``: the worker's pipe and process)
    is owned by the supervisor's I/O thread; the core only keeps it beside
    the slot's bookkeeping.
    """

    __slots__ = (
        "booting",
        "channel",
        "dead",
        "doomed",
        "entry",
        "fresh",
        "jobs",
        "lane",
        "pid",
        "queue",
        "retire_pending",
        "retired",
        "sending",
        "started",
    )

    def __init__(self, lane: LaneState, channel: WorkerChannel) -> None:
        self.lane = lane
        self.channel = channel
        self.pid: int | None = channel.pid  # for failure messages
        self.entry: Entry | None = None
        # Jobs sent to it behind ``entry``, not started yet (still Pending):
        # several in flight per worker while a lane of short jobs has a backlog,
        # so the worker never waits on the supervisor between jobs. Non-empty
        # only while ``entry`` is set; the worker runs them in this order.
        self.queue: deque[Entry] = deque()
        self.started = 0.0  # when ``entry`` started, as far as the supervisor knows
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
        # To be retired once its queue has run (a job asked for it meanwhile).
        self.retire_pending = False
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
        "overdue",
        "prefetched",
        "ready",
        "restarts",
        "retries",
        "running",
        "service",
        "spec",
        "starting",
        "workers",
    )

    def __init__(self, name: str, spec: Lane) -> None:
        self.name = name
        self.spec = spec
        # Jobs accepted into the lane, waiting for a worker: len(ready) <= capacity.
        self.ready: deque[Entry] = deque()
        # Scheduled jobs and retries that fell due while ready was full. They
        # were accepted long ago, so they neither fail nor block anyone: they
        # go into ready first when room appears, before blocked pushes.
        # Non-empty only while ready is full.
        self.overdue: deque[Entry] = deque()
        # Pushes waiting for room, in arrival order, each with its wake-up.
        # Non-empty only while ready is full.
        self.blocked: deque[tuple[Entry, Wakeup]] = deque()
        self.workers: list[WorkerSlot] = []
        # Live workers holding no job. Non-empty only while ready and overdue are empty.
        self.idle: list[WorkerSlot] = []
        self.running = 0
        # Jobs in workers' queues (see WorkerSlot.queue): they count against
        # the capacity as waiting jobs do (len(ready) + prefetched <= capacity).
        self.prefetched = 0
        # Average seconds a job of this lane has run lately (None: none yet);
        # short jobs are sent ahead to busy workers, long ones never are.
        self.service: float | None = None
        self.boot_failures = 0  # workers in a row that died before they were ready
        self.crashes = 0
        self.restarts = 0
        # Replacements decided on but whose process is not started yet: they
        # count as alive, so a waiter woken by a crash sees the lane whole.
        self.starting = 0
        self.completed = 0
        self.failed = 0
        self.retries = 0  # failed attempts that were run again


def current_timer(item: tuple[float, int, Entry]) -> bool:
    """Is this item of a timer heap still the entry's timer? (Timers are
    never removed from the heap: a moved or settled one just goes stale.)"""
    entry = item[2]
    return entry.timed and entry.due == item[0] and entry.outcome is None


def run_wakeups(wakeups: list[Wakeup]) -> None:
    """Run wake-ups with no lock held; one failing never stops the others."""
    for wakeup in wakeups:
        try:
            wakeup()
        except Exception:  # pragma: no cover - a waiter's loop closed under it
            pass
