"""ProcQueue: the public face, blocking and asyncio, over one Core and one Supervisor.

Every push goes through one ``Pusher`` (``_api.push``); the blocking and asyncio
methods differ only in the room they wait in when a lane is full (a
``ThreadRoom`` or a ``TaskRoom``), and in how they wait for a handle (see
``_api.handle``). The constructor's arguments are checked in ``_api.config``.

A queue belongs to the process that opened it. A child made with ``os.fork()``
gets a copy of it: copies of the pipes to the parent's workers, a state map no
thread of its own keeps up to date, locks perhaps held by threads it does not
have. So the child's at-fork hook (``_api.queue_fork``) disowns every
copied queue: its life becomes ``FOREIGN`` (every method that would touch the
workers or the state map raises ``WrongProcess``), its pusher a
``ForeignPusher`` (the push path checks nothing of its own) and its finalizer
is detached, so the child's exit or garbage collection closes nothing of the
parent's.
"""

from __future__ import annotations

import enum
import itertools
import os
import threading
import time
import weakref
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any, TypeVar

from procq._api.config import check_monitor, check_policies, parse_lanes, worker_context
from procq._api.handle import JobHandle
from procq._api.outcomes import Cached, PushOutcome
from procq._api.push import ForeignPusher, Pusher, TaskRoom, ThreadRoom
from procq._api.queue_async import AsyncFace
from procq._api.queue_fork import queues
from procq._api.queue_maps import MapFace
from procq._core.core import Core
from procq._model.errors import ProcQueueError, QueueClosed, WrongProcess
from procq._model.job import Job, Lane, Reuse, check_wait
from procq._model.policies import Retention
from procq._model.settings import check_descriptors
from procq._model.values import Completed, Failed, Pending, Processing, QueueStats, State
from procq._supervisor.loop import Supervisor
from procq._system.sandbox import check as check_sandboxes
from procq._worker import unguarded

if TYPE_CHECKING:
    from procq._api.monitor import Monitor
    from procq._api.transaction import StoreTransaction
    from procq._core.metrics import QueueMetrics
    from procq._durable.core import StoreCore

__all__ = ["ProcQueue"]

T = TypeVar("T")

_STATES = (Pending, Processing, Completed, Failed)

_names = itertools.count(1)


class _Life(enum.Enum):
    """The queue's own lifecycle."""

    OPEN = "open"  # takes pushes
    CLOSING = "closing"  # close() began: no new pushes; waiting and running jobs finish
    CLOSED = "closed"  # every worker stopped and reaped; the supervisor thread ended
    FOREIGN = "foreign"  # a copy in a child made by fork: it belongs to another process (WrongProcess)


class ProcQueue(MapFace, AsyncFace):
    """Runs keyed jobs in supervised worker processes.

    ``lanes`` is an int (one lane, named ``"default"``, with that many
    workers) or a mapping of lane name to an int or a :class:`Lane`. A job with
    no ``lane`` runs in the first lane. ``start_method`` is the
    ``multiprocessing`` start method for workers: ``"forkserver"`` on Linux
    and ``"spawn"`` elsewhere by default.

    ``retention`` (a :class:`Retention`) limits how long ended keys are kept;
    by default every key is kept for the life of the queue. ``reuse`` is the
    default of ``Job.reuse``: how an ended key answers a push (``"failed"``:
    a failed key runs again, a completed one answers ``Cached``).
    ``on_mismatch`` says what a push does when its key's holder (live, or
    kept after it ended) has another function or other arguments:
    ``"raise"`` ``KeyConflict`` (the default: a key names one piece of work,
    so other work under the same key is almost always a bug), ``"warn"`` (a
    ``KeyConflictWarning``, then as ``"ignore"``) or ``"ignore"`` (the key
    alone decides; no fingerprint is taken).

    ``store`` keeps every key in a database shared by every queue opened on
    it, in any process: a path or ``"sqlite:///path"`` (SQLite),
    ``"postgresql://..."`` (PostgreSQL, with ``procq[postgres]``) or a
    ``procq.Store``. ``None`` (the default): keys live in this queue's memory.

    ``name`` names the queue in its metrics and in ``procq top`` (default
    ``"procq-N"``, N counting the queues this process opened). With
    ``monitor=True`` the queue serves read-only snapshots of itself to
    ``procq top`` on a UNIX socket only its user can open, until it closes
    (see docs/observability.md); by default it opens none.

    Use it as a context manager, or call :meth:`close`: leaving the ``with``
    block waits for every waiting and running job, then stops and reaps every
    worker. (On ``KeyboardInterrupt`` it does not wait: waiting jobs are
    cancelled and running ones killed.)
    """

    def __init__(
        self,
        lanes: int | Mapping[str, int | Lane] | None = None,
        *,
        start_method: str | None = None,
        retention: Retention | None = None,
        reuse: Reuse = "failed",
        on_mismatch: str = "raise",
        store: Any = None,
        name: str | None = None,
        monitor: bool = False,
    ) -> None:
        unguarded.check()  # a worker importing an unguarded main script: it ends here, quietly
        parsed = parse_lanes(lanes)
        if any(lane.remote for lane in parsed.values()):
            import procq._cluster.channel  # noqa: F401  (registers the Dask lanes' channel)
        check_monitor(name, monitor)
        number = next(_names)
        self.name = f"procq-{number}" if name is None else name
        check_descriptors(sum(lane.workers for lane in parsed.values()))
        check_policies(retention, reuse, on_mismatch)
        check_sandboxes(parsed)
        self.start_method, context = worker_context(start_method, parsed)
        self._store: StoreCore | None = None
        if store is None:
            self._core = Core(
                parsed,
                retention,
                reuse,
                check_payload=on_mismatch != "ignore",
                strict_payload=on_mismatch == "raise",
            )
        else:  # keys shared through a database (see _store_core)
            from procq._durable.core import StoreCore

            self._core = self._store = StoreCore(
                parsed, retention, reuse, on_mismatch != "ignore", on_mismatch == "raise", store
            )
        self._pusher: Pusher = Pusher(self._core)
        self._life = _Life.OPEN
        self._owner_pid = os.getpid()
        self._close_lock = threading.Lock()
        self._supervisor = Supervisor(self._core, context, str(number))
        self._supervisor.start()
        self._monitor: Monitor | None = None
        if monitor:
            from procq._api.monitor import Monitor

            try:
                self._monitor = Monitor(self._core, self.name)
            except BaseException:
                _close_now(self._core, self._supervisor, None)
                raise
        # An unclosed queue is closed without waiting when it is garbage
        # collected or at interpreter exit, so no worker outlives it.
        self._finalizer = weakref.finalize(self, _close_now, self._core, self._supervisor, self._monitor)
        queues.add(self)

    # --- pushing ------------------------------------------------------------

    def push(self, job: Job[T], *, timeout: float | None = None, wake: bool = False) -> PushOutcome[T]:
        """Push ``job``: ``Queued(handle)``, ``InFlight(handle)`` or ``Cached(output)``.

        Blocks while the job's lane is full; past ``timeout`` seconds raises
        ``LaneFull`` and leaves the key exactly as it was. Raises
        ``QueueClosed`` after ``close()``, ``ValueError`` for an unknown lane,
        ``TypeError`` when the function or arguments cannot be pickled and
        ``KeyConflict`` when the key's holder has another payload.

        With ``wake=True``, a live holder of the key that waits for its
        ``not_before`` time is moved earlier: to this job's own
        ``not_before``, or now. Never later, and never a holder waiting out a
        retry backoff (a key pushed on every upstream event must not hot-loop
        while it is failing); repeated wakes change nothing more. A holder
        that is now due starts at once, without waiting for a timer.
        """
        outcome, room = self._pusher.push(job, check_wait(timeout), wake, ThreadRoom, self)
        if room is not None:
            room.wait()
        return outcome

    async def apush(self, job: Job[T], *, timeout: float | None = None, wake: bool = False) -> PushOutcome[T]:
        """The asyncio form of :meth:`push`.

        While the lane is full the task waits without blocking its loop. A task
        cancelled while it waits for room releases its claim: the key goes back
        to what it was and any push that joined it is woken with ``cancelled``.
        """
        outcome, room = self._pusher.push(job, check_wait(timeout), wake, TaskRoom, self)
        if room is not None:
            await room.wait()
        return outcome

    def transaction(self) -> StoreTransaction:
        """A transaction on the queue's store, for the caller's own statements
        and for pushes that start only if it commits::

            with q.transaction() as tx:
                tx.execute("INSERT INTO batches (name) VALUES (?)", ("b1",))
                tx.push(Job("b1/load", load))

        Inside the block ``tx.execute(sql, params)`` runs a statement and
        ``tx.push`` / ``tx.push_all`` push as usual (answered at once); fresh
        jobs enter their lanes once the transaction commits at the block's end.
        An exception rolls it back: nothing it wrote remains, and its fresh
        jobs' handles end ``cancelled``. While it is open, this queue's other
        pushes and outcome writes wait for it. Needs a store (``ProcQueueError``
        without one).
        """
        self._here()
        if self._store is None:
            raise ProcQueueError("transaction() needs a queue opened with a store: ProcQueue(..., store=...)")
        if self._life is not _Life.OPEN:
            raise QueueClosed("the queue is closed: it takes no transaction")
        from procq._api.transaction import StoreTransaction

        return StoreTransaction(self, self._store)

    def push_all(self, jobs: Iterable[Job[Any]], *, wake: bool = False) -> list[PushOutcome[Any]]:
        """Push many jobs: one outcome per job, in the order given.

        Every key is checked and claimed in one critical section; a key that
        appears twice resolves the later job to the earlier one's claim. If
        any job cannot be pickled (or, with ``on_mismatch="raise"``, conflicts
        with its key's holder), nothing is pushed: every claim is released and
        the error names the job. Then the fresh jobs enter their lanes in
        order, each waiting for room like :meth:`push`.
        """
        with self._pusher.claim_all(jobs, wake, self) as batch:
            for room in batch.offers(ThreadRoom):
                room.wait()
        return batch.outcomes

    async def apush_all(self, jobs: Iterable[Job[Any]], *, wake: bool = False) -> list[PushOutcome[Any]]:
        """The asyncio form of :meth:`push_all`."""
        with self._pusher.claim_all(jobs, wake, self) as batch:
            for room in batch.offers(TaskRoom):
                await room.wait()
        return batch.outcomes

    def push_and_wait(self, job: Job[T], timeout: float | None = None) -> T:
        """Push ``job`` and return its output (``Cached``, or once it ends).

        ``timeout`` bounds the whole call: the wait for room (``LaneFull``) and
        then the wait for the job (``TimeoutError``; the job keeps running).
        Raises ``JobFailed`` if the job fails.
        """
        timeout = check_wait(timeout)
        deadline = None if timeout is None else time.monotonic() + timeout
        outcome = self.push(job, timeout=timeout)
        if isinstance(outcome, Cached):
            return outcome.output
        try:
            return outcome.handle.result(timeout=_left(deadline))
        except TimeoutError:
            raise _unfinished(job, timeout) from None

    async def apush_and_wait(self, job: Job[T], timeout: float | None = None) -> T:
        """The asyncio form of :meth:`push_and_wait`."""
        timeout = check_wait(timeout)
        deadline = None if timeout is None else time.monotonic() + timeout
        outcome = await self.apush(job, timeout=timeout)
        if isinstance(outcome, Cached):
            return outcome.output
        if deadline is None:
            return await outcome.handle
        import asyncio  # not at import time: see _queue_async

        try:
            return await asyncio.wait_for(_await(outcome.handle), _left(deadline))
        except asyncio.TimeoutError:
            raise _unfinished(job, timeout) from None

    # --- cancelling -----------------------------------------------------------

    def cancel(self, key: str) -> bool:
        """Cancel the live job of ``key``; True if this call cancelled it.

        A waiting job is taken out of its lane without running; a running
        job's worker process tree is killed (SIGTERM, then SIGKILL after the
        lane's ``kill_grace``) and the worker replaced. Either way the job ends
        ``Failed(kind="cancelled")``, every waiter is woken, and the key can be
        pushed again like any failed key: a waiting job's at once, a running
        job's once its worker has exited (until then the key stays
        ``Processing`` and a push joins the ending job, so that no new run of
        the key starts beside a tree still cleaning up; see docs/stopping.md).
        Returns False, changing nothing, for an unknown key, a finished one, or
        a job already being ended for another reason (a timeout, say). A job
        that finishes just as it is cancelled ends once: cancelled if this
        returned True.

        It never waits for a job, so it is safe to call from an event loop
        as it is. A job already sent ahead to a busy worker is skipped by that
        worker (it is told before this returns), unless it had started.
        """
        self._here()
        _check_key(key)
        return self._supervisor.cancel(key)

    # --- keys ---------------------------------------------------------------

    def forget(self, key: str) -> bool:
        """Drop an ended key (completed or failed), as if it was never pushed.

        Returns False for a key the queue does not hold. A live key (pending
        or running) cannot be forgotten: ``ValueError``.
        """
        self._here()
        _check_key(key)
        return self._core.forget(key)

    def keys(self, prefix: str | None = None, state: Any = None) -> list[str]:
        """Every key the queue holds, sorted; only those starting with
        ``prefix`` and, given ``state`` (a state class such as ``Completed``,
        or a tuple of them), only those in that state."""
        self._here()
        return [e.key for e in self._core.snapshot(*_filters(prefix, state))]

    def handles(self, prefix: str | None = None, state: Any = None) -> list[JobHandle[Any]]:
        """A handle on every key the queue holds (filtered as :meth:`keys`),
        sorted by key: ``handle.key`` and ``handle.state`` answer "where is
        each key now?", and a live key's handle waits like any other. A
        snapshot: keys pushed later are not in it."""
        self._here()
        core = self._core
        return [JobHandle(core, e, self) for e in core.snapshot(*_filters(prefix, state))]

    # --- reading ------------------------------------------------------------

    def state(self, key: str) -> State | None:
        """The key's state: ``Pending()``, ``Processing()``, ``Completed(output)``,
        ``Failed(failure)``, or ``None`` for a key this queue does not hold
        (never pushed, forgotten, or dropped by its retention)."""
        self._here()
        _check_key(key)
        return self._core.state(key)

    def stats(self) -> QueueStats:
        """Counts of keys per state, and per lane: waiting, running, workers
        alive, crashes and worker restarts."""
        self._here()
        return self._core.stats()

    def metrics(self) -> QueueMetrics:
        """One snapshot of what the queue has counted: per lane, pushes, joins,
        cached answers, starts, ends by kind, depths, workers' starts and
        deaths by cause, run-time and wait-time histograms, workers' memory;
        the recent failures; a store's commits. What ``procq.metrics``'
        exporters and ``procq top`` read (see docs/observability.md)."""
        self._here()
        from procq._core.metrics import metrics

        return metrics(self._core, self.name)

    @property
    def lanes(self) -> dict[str, Lane]:
        return {name: lane.spec for name, lane in self._core.lanes.items()}

    # --- closing ------------------------------------------------------------

    def close(self, wait: bool = True) -> None:
        """Stop taking pushes (``QueueClosed``), end the jobs, stop and reap every worker.

        With ``wait=True`` every waiting and running job finishes first. With
        ``wait=False`` waiting jobs are cancelled, running jobs' process trees
        are killed, and all of them end ``Failed(kind="cancelled")``. Either
        way, when ``close`` returns no worker process is left alive or
        unreaped. Calling it again does nothing; a ``KeyboardInterrupt`` while
        it waits turns it into ``close(wait=False)``. ``wait`` must be a bool
        (``TypeError``): a string such as ``"no"`` would read as true.
        """
        if type(wait) is not bool:
            raise TypeError(f"close(): wait must be True or False, got {type(wait).__name__}: {wait!r}")
        self._here()  # (before the lock: a forked child's copy of it may be held by a thread it does not have)
        if not wait and self._life is not _Life.CLOSED:
            # Before the lock, which a close() waiting for its jobs on another
            # thread holds: this one ends them, and so that one, at once.
            self._core.start_closing()
            self._supervisor.cancel_all()
        with self._close_lock:
            if self._life is _Life.CLOSED:
                return
            self._life = _Life.CLOSING
            core, supervisor = self._core, self._supervisor
            core.start_closing()
            if not wait:
                supervisor.cancel_all()
            try:
                core.drained.wait()
            except BaseException:
                supervisor.cancel_all()
                core.drained.wait()
                raise
            finally:
                if self._monitor is not None:
                    self._monitor.close()
                supervisor.stop()
                self._pusher.segments.close()
                if self._store is not None:
                    self._store.close_store()
                self._finalizer.detach()
                self._life = _Life.CLOSED

    @property
    def closed(self) -> bool:
        """True once ``close()`` began, or the core closed itself (its supervisor
        thread died), and in a forked child's copy (it takes no pushes there)."""
        return self._life is not _Life.OPEN or self._core.closing

    def __enter__(self) -> ProcQueue:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, *_: Any) -> None:
        if self._life is _Life.FOREIGN:
            # A forked child leaving the parent's ``with`` block as it unwinds:
            # the queue is the parent's to close, and nothing of the child's runs in it.
            return
        self.close(wait=not (exc_type is not None and issubclass(exc_type, KeyboardInterrupt)))

    def __repr__(self) -> str:
        lanes = ", ".join(f"{n}={lane.spec.workers}" for n, lane in self._core.lanes.items())
        return f"<ProcQueue {self._life.value} lanes({lanes})>"

    # --- the owning process ----------------------------------------------------

    def _here(self) -> None:
        """Raise ``WrongProcess`` in a forked child's copy of the queue."""
        if self._life is _Life.FOREIGN:
            raise WrongProcess(self._owner_pid, os.getpid())

    def _disown(self) -> None:
        """In a child made by fork, right after the fork: make this copy unusable
        and harmless (see the module docstring). No lock is taken: the child
        has only the forking thread, and a copied lock may be held forever."""
        self._life = _Life.FOREIGN
        self._pusher = ForeignPusher(self._core, self._owner_pid)
        self._finalizer.detach()

    # --- for tests ------------------------------------------------------------

    def _check_invariants(self) -> None:
        self._core._check_invariants()

    def _worker_pids(self) -> list[int]:
        return self._supervisor.pids()


def _check_key(key: Any) -> None:
    if not isinstance(key, str):
        raise TypeError(f"a key is a str, got {type(key).__name__}: {key!r}")


def _filters(prefix: Any, state: Any) -> tuple[str | None, tuple[type, ...] | None]:
    if prefix is not None and not isinstance(prefix, str):
        raise TypeError(f"prefix must be a str or None, got {type(prefix).__name__}")
    if state is None:
        return prefix, None
    kinds = tuple(state) if isinstance(state, (tuple, list, set, frozenset)) else (state,)
    for kind in kinds:
        if kind not in _STATES:
            raise TypeError(
                f"state must be Pending, Processing, Completed or Failed (or a tuple of them), got {kind!r}"
            )
    return prefix, kinds


def _left(deadline: float | None) -> float | None:
    """Seconds until ``deadline`` (monotonic), never below 0; None: no deadline."""
    return None if deadline is None else max(0.0, deadline - time.monotonic())


def _unfinished(job: Job[Any], timeout: float | None) -> TimeoutError:
    return TimeoutError(f"job {job.key!r} has not finished after {timeout}s; it keeps running")


async def _await(handle: JobHandle[T]) -> T:
    return await handle


def _close_now(core: Core, supervisor: Supervisor, monitor: Monitor | None) -> None:
    """Close a queue nobody closed (collected, or at exit), without waiting."""
    if monitor is not None:
        monitor.close()
    core.start_closing()
    supervisor.cancel_all()
    core.drained.wait()
    supervisor.stop()
    close_store = getattr(core, "close_store", None)  # a store's queue: its last writes, its lease
    if close_store is not None:
        close_store()
