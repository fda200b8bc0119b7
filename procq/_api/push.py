"""The push routine: every push, blocking or asyncio, one job or a batch, goes through ``Pusher``.

A push claims its key (``Core.claim``), pickles a fresh job's function and
arguments, and offers the job to its lane (``Core.offer``). The faces differ
only in how a push that finds its lane full waits for room, and that is the
``room`` they pass: ``ThreadRoom`` blocks the calling thread, ``TaskRoom``
awaits a future on the running event loop. The routine returns the room to
wait in, or None when the push needs no wait; a push with a timeout of 0
never waits (a full lane raises ``LaneFull`` at once). ``map`` pushes through
``ProcQueue.push``.

Nothing here holds a lock: ``Core`` takes the state map's lock for each step,
never while a job is pickled or a push waits for room.
"""

from __future__ import annotations

import os
import threading
import time
import types
import warnings
from collections.abc import Callable, Iterable, Iterator
from types import TracebackType
from typing import TYPE_CHECKING, Any, NoReturn, TypeVar

from procq._api.handle import JobHandle
from procq._api.outcomes import Cached, InFlight, PushOutcome, Queued
from procq._core.core import (
    BLOCKED,
    CANCELLED,
    FULL,
    QUEUED,
    STOPPED,
    Core,
    Ended,
    Entry,
    Item,
    LaneState,
    Offer,
    WorkerSlot,
)
from procq._model.errors import JobPicklingError, KeyConflict, KeyConflictWarning, LaneFull, QueueClosed, WrongProcess
from procq._model.job import Job
from procq._model.values import Failed
from procq._wire.fingerprint import fn_name
from procq._wire.main_by_value import main_imported_by_workers
from procq._wire.main_ref import dumps_shared
from procq._wire.protocol import digest, dumps, dumps_fn, pickled_by_reference
from procq._wire.shm import ArgSegments, dumps_args

if TYPE_CHECKING:
    import asyncio

    from procq._api.queue import ProcQueue

__all__ = ["Batch", "ForeignPusher", "Pusher", "Room", "TaskRoom", "ThreadRoom"]

R = TypeVar("R", bound="Room")
#: The pickled arguments of a job that takes none.
NO_ARGS = dumps(((), None))
#: At most this many functions' pickles are kept per queue (``Pusher._serialize``).
MAX_FNS = 4096
#: What a push is given to make its room, should its lane be full: ``ThreadRoom`` or ``TaskRoom``.
MakeRoom = Callable[[Core, Entry, "float | None"], R]


class Room:
    """A push that found its lane full and waits in the lane's blocked queue.

    ``wakeup`` is what the lane calls, from whichever thread made room, once it
    has taken the job. Subclasses say how the push sleeps until then (or
    until its timeout), and then call ``_waited``; a push interrupted in its
    sleep releases its claim instead.
    """

    __slots__ = ("core", "entry", "timeout", "wakeup")

    def __init__(self, core: Core, entry: Entry, timeout: float | None, wakeup: Callable[[], None]) -> None:
        self.core = core
        self.entry = entry
        self.timeout = timeout
        self.wakeup = wakeup

    def _waited(self) -> None:
        """The push stopped waiting: the lane took the job, or the push gives
        up (``LaneFull``, or ``QueueClosed`` when the queue was closed
        meanwhile) and its claim is released."""
        entry, timeout = self.entry, self.timeout
        if self.core.unblock(entry, f"no room in lane {entry.lane.name!r} within {timeout}s") == "accepted":
            return
        if self.core.closing:
            raise QueueClosed(f"the queue was closed while job {entry.key!r} waited for room")
        raise lane_full(entry, timeout)


class ThreadRoom(Room):
    """Waits for room by blocking the calling thread, up to the push's timeout."""

    __slots__ = ("_event",)

    def __init__(self, core: Core, entry: Entry, timeout: float | None) -> None:
        event = threading.Event()
        super().__init__(core, entry, timeout, event.set)
        self._event = event

    def wait(self) -> None:
        try:
            self._event.wait(self.timeout)
        except BaseException:
            self.core.unblock(self.entry, "the push was interrupted while it waited for room")
            raise
        self._waited()


class TaskRoom(Room):
    """Waits for room in an asyncio task, without blocking its loop. A task
    cancelled while it waits releases its claim."""

    __slots__ = ("_future",)

    def __init__(self, core: Core, entry: Entry, timeout: float | None) -> None:
        import asyncio  # not at import time: see _queue_async

        loop = asyncio.get_running_loop()
        future: asyncio.Future[None] = loop.create_future()

        def wakeup() -> None:
            loop.call_soon_threadsafe(_resolve, future)

        super().__init__(core, entry, timeout, wakeup)
        self._future = future

    async def wait(self) -> None:
        import asyncio

        try:
            await asyncio.wait((self._future,), timeout=self.timeout)
        except BaseException:
            self.core.unblock(self.entry, "the pushing task was cancelled while it waited for room")
            raise
        self._waited()


class Pusher:
    """Claims keys, pickles fresh jobs and offers them to their lanes, for one queue.

    ``owner`` (each call's) is the queue: every handle a push makes keeps it
    alive. The pusher does not hold it, so a queue nobody holds is collected
    (and closed) at once.
    """

    __slots__ = ("_core", "_fns", "on_fresh", "segments")

    def __init__(self, core: Core) -> None:
        self._core = core
        # Called with each fresh claim as it is offered, in the pushing thread
        # (no lock held): ``procq.metrics.otel`` opens a job's span there.
        self.on_fresh: Callable[[Entry], None] | None = None
        # Pickles of module-level functions, made once per queue (see _serialize).
        # A plain dict, whose lookup costs a fraction of a weak one's (this runs
        # at every push): a function pickled by reference lives as long as its
        # module anyway. Bounded, for a program that makes such functions anew.
        self._fns: dict[Callable[..., Any], tuple[bytes, bytes]] = {}
        # The queue's shared-memory segments for large arguments, kept for reuse (closed with the queue).
        self.segments = ArgSegments()

    def push(
        self, job: Job[Any], timeout: float | None, wake: bool, room: MakeRoom[R], owner: ProcQueue
    ) -> tuple[PushOutcome[Any], R | None]:
        """Claim ``job.key``; for a fresh claim, pickle the job (releasing the
        claim if that fails) and offer it to its lane. Returns the outcome and
        the room to wait in, if the lane was full. ``wake``: see ``ProcQueue.push``."""
        core = self._core
        if type(job) is not Job and not isinstance(job, Job):  # (_item's check, inlined: this runs at every push)
            raise TypeError(f"push() takes a procq.Job, got {type(job).__name__}")
        lane = core.default_lane if job.lane is None else core.lane_for(job)
        kind, value, conflict = core.claim(job, lane, None if job.not_before is None else job.due(time.monotonic()))
        if conflict is not None:
            self._mismatch(job, conflict)
        if kind == "queued":
            entry: Entry = value
            try:
                self._serialize(entry)
            except BaseException:
                core.abandon(entry, "its function or arguments could not be pickled")
                raise
            return Queued(JobHandle(core, entry, owner)), self.offer(entry, timeout, room)
        if wake and kind == "inflight":
            self.wake_all([(value, job)])
        return self._answer(job, kind, value, owner), None

    def claim_all(self, jobs: Iterable[Job[Any]], wake: bool, owner: ProcQueue) -> Batch:
        """Claim a batch's keys in one critical section and pickle its fresh
        jobs; if any job cannot be pickled (or conflicts with its key's holder,
        under ``on_mismatch="raise"``), release every claim and raise."""
        jobs = list(jobs)
        if not jobs:
            return Batch(self._core, self, [], [], [])
        core = self._core
        items = [self._item(job, i) for i, job in enumerate(jobs)]
        claims, conflict_at = core.claim_all(items)
        if conflict_at is not None and core.strict_payload:
            self._mismatch(jobs[conflict_at], claims[conflict_at][2])  # type: ignore[arg-type]
        for job, claim in zip(jobs, claims, strict=True):
            if claim[2] is not None:
                self._mismatch(job, claim[2])
        fresh = [value for kind, value, _ in claims if kind == "queued"]
        for i, (kind, value, _) in enumerate(claims):
            if kind != "queued":
                continue
            try:
                self._serialize(value)
            except BaseException as exc:
                core.abandon_all(fresh, f"job #{i} of its batch could not be pickled")
                if isinstance(exc, JobPicklingError):
                    raise JobPicklingError(f"push_all(): nothing was pushed: job #{i} {exc}") from exc
                raise
        outcomes: list[PushOutcome[Any]] = []
        woken: list[tuple[Entry, Job[Any]]] = []
        for job, (kind, value, _) in zip(jobs, claims, strict=True):
            if kind == "queued":
                outcomes.append(Queued(JobHandle(core, value, owner)))
            else:
                outcomes.append(self._answer(job, kind, value, owner))
                if wake and kind == "inflight":
                    woken.append((value, job))
        return Batch(self._core, self, outcomes, fresh, woken)

    def offer(self, entry: Entry, timeout: float | None, room: MakeRoom[R]) -> R | None:
        """Hand a fresh claim to its lane. Returns the room to wait in when the
        lane is full and ``timeout`` allows a wait; else sends the job to the
        worker that took it, leaves it in its lane, or refuses it (``LaneFull``,
        ``QueueClosed``) and releases the claim."""
        core = self._core
        if self.on_fresh is not None:
            self.on_fresh(entry)
        offered = core.offer(entry)
        if offered is QUEUED:  # (the common case, before _hand_over's)
            return None
        if offered is FULL and (timeout is None or timeout > 0):
            waiting = room(core, entry, timeout)
            offered = core.offer(entry, waiting.wakeup)
            if offered is BLOCKED:
                return waiting
        self._hand_over(entry, offered, timeout)
        return None

    def wake_all(self, woken: list[tuple[Entry, Job[Any]]]) -> None:
        """Move live holders waiting for their time earlier (see ``Core.wake``)."""
        core = self._core
        for entry, job in woken:
            now = time.monotonic()
            target = job.due(now)
            worker = core.wake(entry, now if target is None else target)
            if worker is not None:
                worker.channel.send_job(core, worker, entry)

    def _item(self, job: Job[Any], index: int | None) -> Item:
        if not isinstance(job, Job):
            where = "push()" if index is None else f"push_all(): job #{index}"
            raise TypeError(f"{where} takes a procq.Job, got {type(job).__name__}")
        lane = self._core.lane_for(job)
        return job, lane, None if job.not_before is None else job.due(time.monotonic())

    def _answer(self, job: Job[Any], kind: str, value: Any, owner: ProcQueue) -> PushOutcome[Any]:
        """The outcome of a claim that started nothing."""
        if kind == "cached":
            return Cached(value)
        core = self._core
        if kind == "inflight":
            return InFlight(JobHandle(core, value, owner))
        assert kind == "failed"  # reuse="never": the key answers with its failure
        return InFlight(JobHandle(core, Ended(job.key, Failed(value)), owner))

    def _mismatch(self, job: Job[Any], conflict: tuple[str, Any]) -> None:
        differs, held_fn = conflict
        if differs == "function":
            held = "a job that ended (its function is not kept)" if held_fn is None else fn_name(held_fn)
            detail = f"another function: this push runs {fn_name(job.fn)}, the key's job {held}"
        else:
            detail = f"other arguments to the same function, {fn_name(job.fn)}"
        message = (
            f"key {job.key!r} is held by a job with {detail}. A key names one "
            "piece of work: use another key for other work, forget() an ended key to run it anew, "
            "or choose ProcQueue(on_mismatch='warn' or 'ignore')"
        )
        if self._core.strict_payload:
            raise KeyConflict(message, job.key, differs)
        # Frames: this, the Pusher's method, the queue's push method, its caller.
        warnings.warn(KeyConflictWarning(message), stacklevel=4)

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
                # (A lane with an initializer: a main script's function runs as the worker's main module has it.)
                data = dumps_fn(fn) if entry.lane.spec.initializer is None else dumps_shared(fn)
                cached = (digest(data), data)
                if type(fn) is types.FunctionType and len(self._fns) < MAX_FNS and pickled_by_reference(fn):
                    self._fns[fn] = cached
            entry.fn_id, entry.fn_bytes = cached
        except (Exception, SystemExit) as exc:  # (a __reduce__ that exits fails the job, not the caller)
            raise JobPicklingError(f"job {job.key!r}: its function {fn!r} could not be pickled: {_why(exc)}") from exc
        try:
            args, kwargs = job.args, job.kwargs
            if not args and kwargs is None:
                entry.args_bytes = NO_ARGS
            elif entry.lane.shared_memory:  # large buffers through shared memory (_wire.shm)
                by_value = not main_imported_by_workers()
                entry.args_bytes, entry.segment = dumps_args((args, kwargs), dumps_fn, self.segments, by_value)
            else:  # an untrusted or remote lane's workers never import the main module
                entry.args_bytes = dumps((args, kwargs), main_by_value=True)
        except (Exception, SystemExit) as exc:
            raise JobPicklingError(f"job {job.key!r}: its arguments could not be pickled: {_why(exc)}") from exc

    def _hand_over(self, entry: Entry, offered: Offer, timeout: float | None) -> None:
        """Act on an offer that did not block: send the job to the worker that
        took it, leave it in its lane, or refuse it and release the claim."""
        core = self._core
        if isinstance(offered, WorkerSlot):
            offered.channel.send_job(core, offered, entry)
        elif offered is CANCELLED:
            pass  # q.cancel() came first: the handle says so
        elif offered is FULL:
            core.abandon(entry, f"lane {entry.lane.name!r} was full")
            raise lane_full(entry, timeout)
        elif offered is STOPPED:
            core.abandon(entry, "the queue stopped")
            raise QueueClosed(f"the queue stopped before job {entry.key!r} could run")


class ForeignPusher(Pusher):
    """The pusher of a queue copied into a child by ``os.fork()``: every push raises ``WrongProcess``.

    The child's at-fork hook puts it in the copied queue's place of its
    ``Pusher`` (see ``ProcQueue._disown``), so the push path itself checks
    nothing: it reads the pusher it reads anyway, and no ``os.getpid()`` runs
    per push.
    """

    __slots__ = ("_owner_pid",)

    def __init__(self, core: Core, owner_pid: int) -> None:
        super().__init__(core)
        self._owner_pid = owner_pid

    def push(self, job: Job[Any], timeout: float | None, wake: bool, room: MakeRoom[R], owner: ProcQueue) -> NoReturn:
        raise WrongProcess(self._owner_pid, os.getpid())

    def claim_all(self, jobs: Iterable[Job[Any]], wake: bool, owner: ProcQueue) -> NoReturn:
        raise WrongProcess(self._owner_pid, os.getpid())


class Batch:
    """A batch whose keys are claimed: its outcomes (one per job, in order)
    and its fresh jobs, offered to their lanes in order by ``offers``.

    Used as a context manager around the offers: leaving it by an exception
    releases the claims not yet offered; leaving it normally wakes the live
    holders the batch asked to wake.
    """

    __slots__ = ("_core", "_fresh", "_offered", "_pusher", "_woken", "outcomes")

    def __init__(
        self,
        core: Core,
        pusher: Pusher,
        outcomes: list[PushOutcome[Any]],
        fresh: list[Entry],
        woken: list[tuple[Entry, Job[Any]]],
    ) -> None:
        self._core = core
        self._pusher = pusher
        self.outcomes = outcomes
        self._fresh = fresh
        self._woken = woken
        self._offered = 0  # fresh entries offered so far

    def offers(self, room: MakeRoom[R]) -> Iterator[R]:
        """Offer each fresh job in turn, yielding a room whenever its lane is
        full: the caller waits in it (without limit) before the next is offered."""
        offer = self._pusher.offer
        for i, entry in enumerate(self._fresh):
            self._offered = i + 1
            waiting = offer(entry, None, room)
            if waiting is not None:
                yield waiting

    def __enter__(self) -> Batch:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        if exc_type is None:
            self._pusher.wake_all(self._woken)
        else:
            self._core.abandon_all(self._fresh[self._offered :], "an earlier job of its batch could not be pushed")


def lane_full(entry: Entry, timeout: float | None) -> LaneFull:
    lane: LaneState = entry.lane
    return LaneFull(
        f"lane {lane.name!r} is full (capacity {lane.spec.capacity}) and had no room for "
        f"job {entry.key!r} within {timeout or 0}s; the key is left as it was"
    )


def _resolve(future: asyncio.Future[None]) -> None:
    if not future.done():
        future.set_result(None)


def _why(exc: BaseException) -> str:
    """What a pickling error says: its message, or, where it has none to
    speak of (``SystemExit: 1``), its repr."""
    text = str(exc)
    return text if isinstance(exc, Exception) and text else repr(exc)
