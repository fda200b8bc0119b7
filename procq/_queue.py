"""ProcQueue: the public face, blocking and asyncio, over one Core and one Supervisor.

The blocking and asyncio methods share every step but the wait for room in a
full lane: claiming, serializing, offering and sending are the same calls into
``Core``. Only how a blocked push sleeps differs (a ``threading.Event`` or an
``asyncio`` future), and how a handle is waited for (see ``_handle``).
"""

from __future__ import annotations

import asyncio
import enum
import itertools
import multiprocessing
import sys
import threading
import time
import types
import weakref
from typing import Any, Callable, Mapping, TypeVar

from procq._core import BLOCKED, CANCELLED, FULL, STOPPED, Core, Entry, LaneState, Offer, WorkerSlot
from procq._errors import JobPicklingError, LaneFull, QueueClosed
from procq._handle import JobHandle
from procq._protocol import digest, dumps, dumps_fn, pickled_by_reference
from procq._supervisor import Supervisor, send_job
from procq._values import Cached, InFlight, Job, Lane, PushOutcome, QueueStats, Queued, State, check_wait

__all__ = ["ProcQueue"]

T = TypeVar("T")

_names = itertools.count(1)


class _Life(enum.Enum):
    """The queue's own lifecycle."""

    OPEN = "open"  # takes pushes
    CLOSING = "closing"  # close() began: no new pushes; waiting and running jobs finish
    CLOSED = "closed"  # every worker stopped and reaped; the supervisor thread ended


def _default_start_method() -> str:
    # forkserver forks workers from a clean single-threaded server, so the
    # supervisor's own threads are never duplicated into a child; it exists on
    # Linux. Elsewhere spawn is the safe choice.
    return "forkserver" if sys.platform.startswith("linux") else "spawn"


def _parse_lanes(lanes: int | Mapping[str, int | Lane] | None) -> dict[str, Lane]:
    if lanes is None:
        return {"default": Lane(workers=multiprocessing.cpu_count())}
    if isinstance(lanes, bool):
        raise TypeError("lanes must be an int or a mapping of lane names to int or Lane, got bool")
    if isinstance(lanes, int):
        if lanes < 1:
            raise ValueError(f"lanes={lanes}: a queue needs at least 1 worker")
        return {"default": Lane(workers=lanes)}
    if isinstance(lanes, Lane):
        return {"default": lanes}
    if not isinstance(lanes, Mapping):
        raise TypeError(
            f"lanes must be an int or a mapping of lane names to int or Lane, got {type(lanes).__name__}"
        )
    if not lanes:
        raise ValueError("lanes must name at least one lane")
    parsed: dict[str, Lane] = {}
    for name, spec in lanes.items():
        if not isinstance(name, str) or not name:
            raise TypeError(f"lane names must be non-empty str, got {name!r}")
        if isinstance(spec, Lane):
            parsed[name] = spec
        elif isinstance(spec, int) and not isinstance(spec, bool):
            if spec < 1:
                raise ValueError(f"lane {name!r} needs at least 1 worker, got {spec}")
            parsed[name] = Lane(workers=spec)
        else:
            raise TypeError(f"lane {name!r}: expected an int or a Lane, got {type(spec).__name__}")
    return parsed


class ProcQueue:
    """Runs keyed jobs in supervised worker processes.

    ``lanes`` is an int (one lane, named ``"default"``, with that many
    workers) or a mapping of lane name to an int or a :class:`Lane`. A job with
    no ``lane`` runs in the first lane. ``start_method`` is the
    ``multiprocessing`` start method for workers: ``"forkserver"`` on Linux
    and ``"spawn"`` elsewhere by default.

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
    ) -> None:
        parsed = _parse_lanes(lanes)
        method = start_method or _default_start_method()
        if method == "fork":
            # The supervisor runs a thread, and a fork copies a threaded process
            # with its locks held mid-use; the child would also inherit every
            # other worker's pipe, so no worker would see EOF when it should.
            raise ValueError(
                "start method 'fork' is not supported: the supervisor runs a thread, and forking "
                "a threaded process can deadlock the child; use 'forkserver' or 'spawn'"
            )
        try:
            context = multiprocessing.get_context(method)
        except ValueError:
            known = ", ".join(multiprocessing.get_all_start_methods())
            raise ValueError(f"unknown start method {method!r}; this platform has {known}") from None
        self.start_method = method
        self._core = Core(parsed)
        self._life = _Life.OPEN
        self._close_lock = threading.Lock()
        # Pickles of module-level functions, made once per queue (see _serialize).
        self._fns: weakref.WeakKeyDictionary[Callable[..., Any], tuple[bytes, bytes]] = weakref.WeakKeyDictionary()
        self._supervisor = Supervisor(self._core, context, str(next(_names)))
        self._supervisor.start()
        # An unclosed queue is closed without waiting when it is garbage
        # collected or at interpreter exit, so no worker outlives it.
        self._finalizer = weakref.finalize(self, _close_now, self._core, self._supervisor)

    # --- pushing ------------------------------------------------------------

    def push(self, job: Job[T], *, timeout: float | None = None) -> PushOutcome:
        """Push ``job``: ``Queued(handle)``, ``InFlight(handle)`` or ``Cached(output)``.

        Blocks while the job's lane is full; past ``timeout`` seconds raises
        ``LaneFull`` and leaves the key exactly as it was. Raises
        ``QueueClosed`` after ``close()``, ``ValueError`` for an unknown lane and
        ``TypeError`` when the function or arguments cannot be pickled.
        """
        timeout = check_wait(timeout)
        outcome, entry = self._claim(job)
        if entry is None:
            return outcome
        core = self._core
        offered = core.offer(entry)
        if offered is FULL and _may_wait(timeout):
            event = threading.Event()
            offered = core.offer(entry, event.set)
            if offered is BLOCKED:
                try:
                    event.wait(timeout)
                except BaseException:
                    core.unblock(entry, "the push was interrupted while it waited for room")
                    raise
                self._after_block(entry, timeout)
                return outcome
        self._hand_over(entry, offered, timeout)
        return outcome

    async def apush(self, job: Job[T], *, timeout: float | None = None) -> PushOutcome:
        """The asyncio form of :meth:`push`.

        While the lane is full the task waits without blocking its loop. A task
        cancelled while it waits for room releases its claim: the key goes back
        to what it was and any push that joined it is woken with ``cancelled``.
        """
        timeout = check_wait(timeout)
        outcome, entry = self._claim(job)
        if entry is None:
            return outcome
        core = self._core
        offered = core.offer(entry)
        if offered is FULL and _may_wait(timeout):
            loop = asyncio.get_running_loop()
            room: asyncio.Future[None] = loop.create_future()

            def wakeup() -> None:
                loop.call_soon_threadsafe(_resolve, room)

            offered = core.offer(entry, wakeup)
            if offered is BLOCKED:
                try:
                    await asyncio.wait((room,), timeout=timeout)
                except BaseException:
                    core.unblock(entry, "the pushing task was cancelled while it waited for room")
                    raise
                self._after_block(entry, timeout)
                return outcome
        self._hand_over(entry, offered, timeout)
        return outcome

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
            return outcome.output  # type: ignore[no-any-return]
        remaining = None if deadline is None else max(0.0, deadline - time.monotonic())
        try:
            return outcome.handle.result(remaining)  # type: ignore[no-any-return]
        except TimeoutError:
            raise _unfinished(job, timeout) from None

    async def apush_and_wait(self, job: Job[T], timeout: float | None = None) -> T:
        """The asyncio form of :meth:`push_and_wait`."""
        timeout = check_wait(timeout)
        deadline = None if timeout is None else time.monotonic() + timeout
        outcome = await self.apush(job, timeout=timeout)
        if isinstance(outcome, Cached):
            return outcome.output  # type: ignore[no-any-return]
        if deadline is None:
            return await outcome.handle  # type: ignore[no-any-return]
        remaining = max(0.0, deadline - time.monotonic())
        try:
            return await asyncio.wait_for(_await(outcome.handle), remaining)
        except asyncio.TimeoutError:
            raise _unfinished(job, timeout) from None

    def _claim(self, job: Job[T]) -> tuple[PushOutcome, Entry | None]:
        """Claim ``job.key``. For a fresh claim, serialize the job (releasing
        the claim if that fails) and return the entry to offer to its lane."""
        if not isinstance(job, Job):
            raise TypeError(f"push() takes a procq.Job, got {type(job).__name__}")
        core = self._core
        lane = core.lane_for(job)
        kind, value = core.claim(job, lane)
        if kind == "cached":
            return Cached(value), None
        if kind == "inflight":
            return InFlight(JobHandle(core, value, self)), None
        entry: Entry = value
        try:
            self._serialize(entry)
        except BaseException:
            core.abandon(entry, "its function or arguments could not be pickled")
            raise
        return Queued(JobHandle(core, entry, self)), entry

    def _serialize(self, entry: Entry) -> None:
        job = entry.job
        fn = job.fn
        try:
            # A module-level function pickles to the same reference every time:
            # pickle it once per queue. Anything pickled by value (a lambda, a
            # closure) is pickled at every push, so the job runs with the values
            # it has now; its digest still spares the pipe and the worker.
            cached = self._fns.get(fn) if type(fn) is types.FunctionType else None
            if cached is None:
                data = dumps_fn(fn)
                cached = (digest(data), data)
                if type(fn) is types.FunctionType and pickled_by_reference(fn):
                    self._fns[fn] = cached
            entry.fn_id, entry.fn_bytes = cached
        except Exception as exc:
            raise JobPicklingError(f"job {job.key!r}: its function {fn!r} could not be pickled: {exc}") from exc
        try:
            entry.args_bytes = dumps((job.args, job.kwargs))
        except Exception as exc:
            raise JobPicklingError(f"job {job.key!r}: its arguments could not be pickled: {exc}") from exc

    def _hand_over(self, entry: Entry, offered: Offer, timeout: float | None) -> None:
        """Act on an offer that did not block: send the job to the worker that
        took it, leave it in its lane, or refuse it and release the claim."""
        core = self._core
        if isinstance(offered, WorkerSlot):
            send_job(core, offered, entry)
        elif offered is CANCELLED:
            pass  # q.cancel() came first: the handle says so
        elif offered is FULL:
            core.abandon(entry, f"lane {entry.lane.name!r} was full")
            raise _lane_full(entry, timeout)
        elif offered is STOPPED:
            core.abandon(entry, "the queue stopped")
            raise QueueClosed(f"the queue stopped before job {entry.key!r} could run")

    def _after_block(self, entry: Entry, timeout: float | None) -> None:
        """A push stopped waiting for room: it was accepted, or it gives up."""
        why = f"no room in lane {entry.lane.name!r} within {timeout}s"
        if self._core.unblock(entry, why) == "accepted":
            return
        if self._core.closing:
            raise QueueClosed(f"the queue was closed while job {entry.key!r} waited for room")
        raise _lane_full(entry, timeout)

    # --- cancelling -----------------------------------------------------------

    def cancel(self, key: str) -> bool:
        """Cancel the live job of ``key``; True if this call cancelled it.

        A waiting job is taken out of its lane without running; a running
        job's worker process tree is killed (SIGTERM, then SIGKILL after the
        lane's ``kill_grace``) and the worker replaced. Either way the job ends
        ``Failed(kind="cancelled")``, every waiter is woken, and the key can be
        pushed again like any failed key. Returns False, changing nothing, for
        an unknown key, a finished one, or a job already being ended for
        another reason (a timeout, say). A job that finishes just as it is
        cancelled ends once: cancelled if this returned True.

        It never blocks, so it is safe to call from an event loop as it is.
        """
        if not isinstance(key, str):
            raise TypeError(f"a key is a str, got {type(key).__name__}: {key!r}")
        return self._supervisor.cancel(key)

    # --- reading ------------------------------------------------------------

    def state(self, key: str) -> State | None:
        """The key's state: ``Pending()``, ``Processing()``, ``Completed(output)``,
        ``Failed(failure)``, or ``None`` for a key this queue has never kept."""
        if not isinstance(key, str):
            raise TypeError(f"a key is a str, got {type(key).__name__}: {key!r}")
        return self._core.state(key)

    def stats(self) -> QueueStats:
        """Counts of keys per state, and per lane: waiting, running, workers
        alive, crashes and worker restarts."""
        return self._core.stats()

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
        it waits turns it into ``close(wait=False)``.
        """
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
                supervisor.stop()
                self._finalizer.detach()
                self._life = _Life.CLOSED

    @property
    def closed(self) -> bool:
        return self._life is not _Life.OPEN

    def __enter__(self) -> ProcQueue:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, *_: Any) -> None:
        self.close(wait=not (exc_type is not None and issubclass(exc_type, KeyboardInterrupt)))

    def __repr__(self) -> str:
        lanes = ", ".join(f"{n}={lane.spec.workers}" for n, lane in self._core.lanes.items())
        return f"<ProcQueue {self._life.value} lanes({lanes})>"

    # --- for tests ------------------------------------------------------------

    def _check_invariants(self) -> None:
        self._core._check_invariants()

    def _worker_pids(self) -> list[int]:
        return self._supervisor.pids()


def _unfinished(job: Job[Any], timeout: float | None) -> TimeoutError:
    return TimeoutError(f"job {job.key!r} has not finished after {timeout}s; it keeps running")


def _may_wait(timeout: float | None) -> bool:
    return timeout is None or timeout > 0


def _lane_full(entry: Entry, timeout: float | None) -> LaneFull:
    lane: LaneState = entry.lane
    return LaneFull(
        f"lane {lane.name!r} is full (capacity {lane.spec.capacity}) and had no room for "
        f"job {entry.key!r} within {timeout or 0}s; the key is left as it was"
    )


def _resolve(future: asyncio.Future[None]) -> None:
    if not future.done():
        future.set_result(None)


async def _await(handle: JobHandle[T]) -> T:
    return await handle


def _close_now(core: Core, supervisor: Supervisor) -> None:
    """Close a queue nobody closed (collected, or at exit), without waiting."""
    core.start_closing()
    supervisor.cancel_all()
    core.drained.wait()
    supervisor.stop()
