"""The core's bookkeeping objects: a claim (``Entry``) and its ``Status``, what
its handles hold (``Face``), a worker (``WorkerSlot``) and its ``WorkerLife``,
a lane (``LaneState``). The core's parts (``_core.py`` and the modules it is
composed of) change them under ``Core.lock``; nothing here takes a lock or
does I/O.
"""

from __future__ import annotations

import enum
import threading
from collections import deque
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from procq._core.metrics import Tally
from procq._model.job import Job, Lane
from procq._model.network import Refusals
from procq._model.values import (
    Completed,
    Failed,
    Failure,
    LaneStats,
    Pending,
    Processing,
    State,
)
from procq._system.sandbox import enforced

if TYPE_CHECKING:
    from procq._core.channel import WorkerChannel
    from procq._core.retention import Record
    from procq._wire.shm import Segment

__all__ = [
    "ABANDONED",
    "DONE",
    "PENDING",
    "PROCESSING",
    "Ended",
    "Entry",
    "Face",
    "Held",
    "LaneState",
    "Status",
    "WorkerLife",
    "WorkerSlot",
    "current_timer",
    "run_wakeups",
]

Wakeup = Callable[[], None]


class Status(enum.IntEnum):
    """An entry's status. Only ``_core.statemap.StateMap._move`` changes it."""

    PENDING = 0  # claimed, not yet given to a worker: waiting for room, for its time, or in its lane
    PROCESSING = 1  # a worker holds it
    DONE = 2  # ``outcome`` is set and will never change
    ABANDONED = 3  # DONE, but the claim never reached its lane: the key went back to what it was


# The members as module names, compared with ``is`` on the hot paths.
PENDING, PROCESSING, DONE, ABANDONED = Status.PENDING, Status.PROCESSING, Status.DONE, Status.ABANDONED


class WorkerLife(enum.Enum):
    """Where a worker is in its life, as the core sees it.

    ::

        BOOTING ──READY──> READY ──(retired between jobs)──> RETIRED ──┐
           │                │ ^                                       ├──(death handled)──> DEAD
           │ doom           │ └── spare (q.cancel's job ended first)  │
           v                v doom                                    │
        DOOMED_BOOTING ──READY──> DOOMED ─────────────────────────────┘

    Every life can end in DEAD. ``WorkerSlot.doom`` is the one way to doom.
    """

    BOOTING = "booting"  # started, has not said READY: takes no job; a death now is a failure to start
    READY = "ready"  # takes jobs (idle or busy: see ``WorkerSlot.entry``)
    DOOMED = "doomed"  # being killed, or its pipe or process is ending: takes no more jobs
    DOOMED_BOOTING = "doomed booting"  # doomed before it said READY: its death is a failure to start
    RETIRED = "retired"  # replaced between jobs: out of ``lane.workers``; it exits on EOF
    DEAD = "dead"  # its death has been handled

    @property
    def booting(self) -> bool:
        """Has it not said READY yet?"""
        return self is WorkerLife.BOOTING or self is WorkerLife.DOOMED_BOOTING


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
        "face",
        "fn_bytes",
        "fn_id",
        "fp",
        "history",
        "job",
        "job_id",
        "key",
        "kill_reason",
        "lane",
        "memory_limit",
        "outcome",
        "pid",
        "prev",
        "rss_base",
        "segment",
        "since",
        "started",
        "status",
        "timed",
        "timeout",
        "unstarted",
        "worker",
    )

    def __init__(self, job: Job[Any], lane: LaneState, job_id: int, prev: Record | None) -> None:
        # The job while the entry is live; deleted when it ends (StateMap._ended).
        # What threads outside Core.lock read (a sender, a report's decoding)
        # is copied beside it, so that it stays readable after the end.
        self.job = job
        self.key = job.key
        self.timeout = job.timeout  # None: its lane's
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
        # The shared-memory segment holding its arguments' large buffers
        # (``_wire.shm.Segment``), or None; given back as the entry ends.
        self.segment: Segment | None = None
        # The job's fingerprint (see _fingerprint), None when not checked.
        self.fp: bytes | None = None
        # Waiters: a threading.Event made on demand by a blocking result(), and
        # callbacks from awaiting tasks. Both are fired with no lock held.
        self.event: threading.Event | None = None
        self.callbacks: list[Wakeup] | None = None
        self.deadline: float | None = None
        # The job's memory limit, or its lane's (bytes), and the worker's
        # resident memory when the job was sent (what the limit is on top of).
        limit = job.memory_limit
        self.memory_limit: int | None = limit if limit is not None else lane.memory_limit
        self.rss_base = 0
        # Set when the attempt's end was decided from outside (timeout, memory,
        # q.cancel, close without waiting): the failure it ends with, whatever
        # the worker reports or however it dies after that.
        self.kill_reason: Failure | None = None
        # The worker holding it while PROCESSING, or that it was sent ahead to.
        self.worker: WorkerSlot | None = None
        # The attempt that runs next (or runs now), from 1; earlier attempts' failures.
        self.attempt = 1
        self.history: list[Failure] | None = None
        # How many times it was given to a worker that died before starting
        # it (``Dispatch.died``): it goes to another, up to a limit.
        self.unstarted = 0
        # When it may enter its lane (on ``Core.clock``), while PENDING and not
        # yet there: a not_before time or a retry backoff. None: at once.
        self.due: float | None = None
        # In ``Timers.waiting``, waiting for ``due`` (invariant: timed => due is not None).
        self.timed = False
        # For the metrics and traces (``_core.metrics``): when it was claimed or
        # last entered its lane, when its attempt started and on which worker
        # process (kept after it ends, unlike ``worker``).
        self.since = 0.0
        self.started = 0.0
        self.pid: int | None = None
        # What this claim's handles hold (made with the first): it stands for
        # the entry, so that once the job completes the entry can be freed
        # (see ``Face``). Written without the lock by the thread making the
        # handle, read under it when the job ends.
        self.face: Face | None = None

    def state(self) -> State:
        if self.outcome is not None:
            return self.outcome
        if self.status is PROCESSING:
            return _PROCESSING
        return _PENDING if self.attempt == 1 else Pending(attempt=self.attempt)

    def state_before_outcome(self) -> State:
        """The state of an ended job whose outcome may not be given out yet (a
        store's, until its row is committed): the one it ended from."""
        return _PROCESSING if self.started else _PENDING if self.attempt == 1 else Pending(attempt=self.attempt)


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


class Face:
    """What the handles on a claim hold (``Entry.face``, made with its first
    handle): it stands for the live entry until the job completes, then holds
    its output, and the entry is freed.

    While the job runs, ``output`` holds the entry itself (``JobHandle._entry``
    tells them apart): the in-memory store's one write of the job's output at
    its completion is the switch, so a handle reading without the lock sees
    the entry or the output, never neither. A program that keeps its handles
    then keeps two objects per completed job (the handle and this), not the
    handle, the entry and its ``Completed``: fewer objects for the garbage
    collector to walk at every collection. A job that fails or is abandoned
    leaves the entry there (handles read the failure from the entry), and so
    does every job of a store whose outcomes wait for a commit before they
    are given out.
    """

    __slots__ = ("key", "output")

    #: Read like an ended entry's (``Entry.status``) by whoever a handle gives it to.
    status = DONE

    def __init__(self, entry: Entry) -> None:
        self.key = entry.key
        self.output: Any = entry

    @property
    def outcome(self) -> Completed[Any]:
        """As an ended entry's ``outcome`` (a handle gives a completed ``Face`` where it gave the entry)."""
        return Completed(self.output)

    def state(self) -> Completed[Any]:
        return Completed(self.output)


#: What a handle reads its job from: the live entry, its stand-in, or a record's ``Ended``.
Held = Entry | Ended | Face


class WorkerSlot:
    """The core's view of one worker process: its life, which job it holds,
    which jobs it was sent ahead.

    ``channel`` (a ``_supervisor.channels.WorkerChannel``: the worker's pipe and process)
    is owned by the supervisor's I/O thread; the core only keeps it beside
    the slot's bookkeeping.
    """

    __slots__ = (
        "channel",
        "entry",
        "jobs",
        "lane",
        "led",
        "life",
        "pid",
        "queue",
        "reading",
        "retire_cause",
        "retire_requested",
        "sending",
        "spare",
        "started",
        "unwatched",
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
        self.started = 0.0  # when ``entry`` started (``Core.clock``), as far as the supervisor knows
        # Threads that have been given this worker's pipe to send on and have
        # not reported back yet. The pipe is closed only when this is 0, so a
        # descriptor is never closed (and reused) under a sender.
        self.sending = 0
        # The supervisor's selector no longer holds its pipe (set under
        # ``Core.lock`` once a retired worker's pipe is taken out): only then
        # may the last sender close it, since a closed descriptor cannot be
        # taken out of the selector, and its number may be reused meanwhile.
        self.unwatched = False
        # Held by whichever thread reads the pipe: the I/O thread, or a caller
        # waiting on the job the worker runs (``_supervisor.lead``).
        self.reading = threading.Lock()
        # True while the thread holding ``reading`` is such a caller, not the
        # I/O thread: the other callers waiting on its jobs then wait to be
        # woken, not to take over (``_supervisor.lead``).
        self.led = False
        self.life = WorkerLife.BOOTING
        self.jobs = 0  # jobs it has been given (0: a fresh worker)
        # A report asked for it to be replaced (``max_worker_rss``) while it had
        # jobs queued: a request, kept whatever its life is meanwhile. It gets
        # no more jobs sent ahead and is retired once its queue has run.
        self.retire_requested = False
        # Why it was retired, when its job's failure was why (a "memory" error
        # leaves a worker unfit): what its death counts as in the metrics.
        self.retire_cause: str | None = None
        # A warm spare (in ``lane.spares``, not ``lane.workers``): it boots and
        # then waits, taking no job, until it replaces a worker (``_core.spares``).
        self.spare = False

    def doom(self) -> None:
        """It gets no more jobs: it is being killed, or is dying (caller holds
        ``Core.lock``). A retired or dead worker stays as it is."""
        if self.life is WorkerLife.READY:
            self.life = WorkerLife.DOOMED
        elif self.life is WorkerLife.BOOTING:
            self.life = WorkerLife.DOOMED_BOOTING


class LaneState:
    """A lane's limit, queues and counters."""

    __slots__ = (
        "blocked",
        "boot_failures",
        "completed",
        "count_cached",
        "crashes",
        "failed",
        "idle",
        "memory_limit",
        "name",
        "overdue",
        "prefetched",
        "ready",
        "refusals",
        "restarts",
        "retries",
        "running",
        "service",
        "shared_memory",
        "spares",
        "spares_on",
        "spec",
        "starting",
        "tally",
        "workers",
    )

    def __init__(self, name: str, spec: Lane) -> None:
        self.name = name
        self.spec = spec
        self.memory_limit = spec.memory_limit_bytes  # (read for every entry: see Entry)
        # What a sandbox's network allow-list refused the lane's jobs (its own lock; see _model.network).
        self.refusals = Refusals()
        # Do its jobs' large buffers travel through shared memory (``_wire.shm``)?
        # Only a trusted lane's local workers may map the supervisor's memory.
        self.shared_memory = spec.trusted and not spec.remote
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
        # Warm spare workers, booting or READY, none of them holding a job,
        # none of them counted in ``workers`` (see ``_core.spares``). The lane keeps
        # ``spec.spares`` of them once ``spares_on``: after its first crash.
        self.spares: list[WorkerSlot] = []
        self.spares_on = False
        self.tally = Tally()  # what the metrics count (``_core.metrics``)
        # Counts a cached answer given without Core.lock: ``next()`` of an
        # ``itertools.count``, bound once (one C call, atomic under the GIL).
        self.count_cached = self.tally.cached_unlocked.__next__

    def stats(self) -> LaneStats:
        """What ``q.stats()`` says of this lane (under ``Core.lock``)."""
        return LaneStats(
            name=self.name,
            workers=self.spec.workers,
            capacity=self.spec.capacity,
            waiting=len(self.ready) + self.prefetched + len(self.overdue) + len(self.blocked),
            running=self.running,
            workers_alive=len(self.workers) + self.starting,
            crashes=self.crashes,
            worker_restarts=self.restarts,
            completed=self.completed,
            failed=self.failed,
            retries=self.retries,
            spares=len(self.spares),
            sandbox=enforced(self.spec.sandbox, self.spec),  # type: ignore[arg-type]
        )


def current_timer(item: tuple[float, int, Entry]) -> bool:
    """Is this item of a timer heap still the entry's timer? (Timers are
    never removed from the heap: a moved or settled one just goes stale.)"""
    entry = item[2]
    return entry.timed and entry.due == item[0] and entry.outcome is None


def run_wakeups(wakeups: list[Wakeup]) -> None:
    """Run wake-ups with no lock held; one failing never stops the others."""
    for wakeup in wakeups:
        try:  # noqa: SIM105 - suppress() would cost a context manager per wake-up
            wakeup()
        except Exception:  # pragma: no cover - a waiter's loop closed under it
            pass
